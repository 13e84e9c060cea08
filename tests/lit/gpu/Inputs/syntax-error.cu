extern "C" __global__ void fine(float *y)
{
    y[threadIdx.x] = 1.0f;
}

extern "C" __global__ void __launch_bounds__(128) missing_semicolon(float *y)
{
    y[threadIdx.x] = 2.0f
}

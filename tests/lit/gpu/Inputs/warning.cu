extern "C" __global__ void fine(float *y)
{
    y[threadIdx.x] = 1.0f;
}

extern "C" __global__ void unused_variable(float *y)
{
    int unused;
    y[threadIdx.x] = 2.0f;
}

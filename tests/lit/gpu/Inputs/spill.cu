// 64 accumulators live across a loop: about 72 registers, so under
// --maxrregcount=32 ptxas must spill them to local memory.
extern "C" __global__ void many_accumulators(float *out, const float *in, int n)
{
    float acc[64];
#pragma unroll
    for (int j = 0; j < 64; j++)
        acc[j] = in[j * n + threadIdx.x];
    for (int it = 0; it < n; it++) {
#pragma unroll
        for (int j = 0; j < 64; j++)
            acc[j] = acc[j] * acc[(j + 1) & 63] + in[it];
    }
    float s = 0;
#pragma unroll
    for (int j = 0; j < 64; j++)
        s += acc[j];
    out[threadIdx.x] = s;
}

extern "C" __global__ void small(float *y)
{
    y[threadIdx.x] = 1.0f;
}

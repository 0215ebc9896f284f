// One kernel per opcode under question: each loop body repeats one PTX operation 8 times,
// so per-pipe hardware counters (ncu) show which pipe that SASS opcode issues to. Used on
// a GPU box to check suite/alu/isa.py's pipe table; `nvcc -o zoo alu_zoo.cu && ./zoo`.
#include <cstdint>
#include <cstdio>

#define R8(S) S S S S S S S S
#define ZOO_U(name, INSN)                                                            \
    extern "C" __global__ void zoo_##name(uint32_t* io, int iters) {                \
        uint32_t x = io[threadIdx.x], y = x * 0x9e3779b9u;                          \
        _Pragma("unroll 1") for (int it = 0; it < iters; ++it) {                    \
            R8(asm volatile(INSN : "+r"(x) : "r"(y));)                              \
        }                                                                           \
        io[threadIdx.x] = x;                                                        \
    }
#define ZOO_F(name, INSN)                                                            \
    extern "C" __global__ void zoo_##name(uint32_t* io, int iters) {                \
        float x = __uint_as_float(io[threadIdx.x] & 0x3fffffffu), y = x * 0.5f;     \
        _Pragma("unroll 1") for (int it = 0; it < iters; ++it) {                    \
            R8(asm volatile(INSN : "+f"(x) : "f"(y));)                              \
        }                                                                           \
        io[threadIdx.x] = __float_as_uint(x);                                       \
    }

ZOO_U(prmt, "prmt.b32 %0, %0, %1, 0x3210;")
ZOO_U(lop3, "lop3.b32 %0, %0, %1, 0x43004300, 0xea;")
ZOO_U(shf, "shf.r.wrap.b32 %0, %0, %1, 5;")
ZOO_U(popc, "popc.b32 %0, %0; xor.b32 %0, %0, %1;")
ZOO_U(flo, "bfind.u32 %0, %0; xor.b32 %0, %0, %1;")
ZOO_U(brev, "brev.b32 %0, %0; add.u32 %0, %0, %1;")
ZOO_U(imnmx, "min.s32 %0, %0, %1; xor.b32 %0, %0, 0x55;")
ZOO_U(imad_hi, "mul.hi.u32 %0, %0, %1;")
ZOO_U(imad, "mad.lo.u32 %0, %0, %1, %0;")
ZOO_U(imad_wide, "{.reg .u64 w; .reg .u32 a, b; mul.wide.u32 w, %0, %1; mov.b64 {a, b}, w; xor.b32 %0, a, b;}")
ZOO_U(iadd, "add.u32 %0, %0, %1;")
ZOO_U(iadd3, "{.reg .u32 t; add.u32 t, %0, %1; add.u32 %0, t, 0x77;}")
ZOO_U(bmsk, "bmsk.clamp.b32 %0, %0, %1;")
ZOO_U(sgxt, "szext.wrap.s32 %0, %0, %1;")
ZOO_U(iabs, "{.reg .s32 t; abs.s32 t, %0; xor.b32 %0, t, %1;}")
ZOO_U(sel, "{.reg .pred q; setp.lt.u32 q, %0, %1; selp.b32 %0, %0, %1, q;}")
ZOO_U(f2fp, "{.reg .f32 a; mov.b32 a, %0; cvt.rn.bf16x2.f32 %0, a, a;}")
ZOO_U(hadd2_f32, "{.reg .f16 h; .reg .f32 a; mov.b32 {h, _}, %0; cvt.f32.f16 a, h; mov.b32 %0, a;}")
ZOO_U(hfma2, "fma.rn.f16x2 %0, %0, %1, %1;")
ZOO_U(hmul2, "mul.rn.bf16x2 %0, %0, %1;")
ZOO_U(i2i, "cvt.sat.s8.s32 %0, %0;")
ZOO_U(idp4a, "dp4a.u32.u32 %0, %0, %1, %0;")
ZOO_U(shfl, "shfl.sync.bfly.b32 %0, %0, 1, 0x1f, 0xffffffff;")
ZOO_U(vote, "{.reg .pred q; setp.ne.u32 q, %0, %1; vote.sync.ballot.b32 %0, q, 0xffffffff;}")
ZOO_U(i2f_f2i, "{.reg .f32 a; .reg .u32 t; cvt.rn.f32.u32 a, %0; cvt.rzi.u32.f32 t, a; xor.b32 %0, t, %1;}")
ZOO_F(fmnmx, "max.f32 %0, %0, %1;")
ZOO_F(fsel, "{.reg .pred q; setp.lt.f32 q, %0, %1; selp.f32 %0, %0, %1, q;}")
ZOO_F(ffma, "fma.rn.f32 %0, %0, %1, %1;")
ZOO_F(mufu, "ex2.approx.ftz.f32 %0, %0;")
ZOO_F(frnd, "cvt.rni.f32.f32 %0, %0;")
ZOO_F(f2f, "{.reg .f16 h; cvt.rn.f16.f32 h, %0; cvt.f32.f16 %0, h;}")

typedef void (*zoo_fn)(uint32_t*, int);
int main() {
    const zoo_fn kernels[] = {
        zoo_prmt, zoo_lop3, zoo_shf, zoo_popc, zoo_flo, zoo_brev, zoo_imnmx, zoo_imad_hi,
        zoo_imad, zoo_imad_wide, zoo_iadd, zoo_iadd3, zoo_bmsk, zoo_sgxt, zoo_iabs, zoo_sel,
        zoo_f2fp, zoo_hadd2_f32, zoo_hfma2, zoo_hmul2, zoo_i2i, zoo_idp4a, zoo_shfl, zoo_vote,
        zoo_i2f_f2i, zoo_fmnmx, zoo_fsel, zoo_ffma, zoo_mufu, zoo_frnd, zoo_f2f};
    uint32_t* io;
    cudaMalloc(&io, sizeof(uint32_t) * 256);
    cudaMemset(io, 0x3c, sizeof(uint32_t) * 256);
    for (zoo_fn k : kernels) k<<<132, 256>>>(io, 100);
    const cudaError_t err = cudaDeviceSynchronize();
    printf("zoo: %s\n", cudaGetErrorString(err));
    return err != cudaSuccess;
}

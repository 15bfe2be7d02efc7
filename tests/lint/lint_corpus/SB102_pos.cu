__device__ void add(float* p, float v, unsigned* q, unsigned w) {
    asm volatile("red.global.add.f32 [%0], %1;" :: "l"(p), "f"(v));  // expect: SB102
    asm("atom.global.add.noftz.bf16x2 %0, [%1], %2;" : "=r"(r) : "l"(q), "r"(w));  // expect: SB102
    __asm__ __volatile__(  // expect: SB102
        "red.relaxed.gpu.global.add.f16 [%0], %1;"
        :: "l"(p), "h"(hv));
}

__device__ void inc(unsigned* p, unsigned r) {
    asm volatile("red.global.add.u32 [%0], 1;" :: "l"(p));
    asm volatile("atom.global.cas.b32 %0, [%1], 0, 1;" : "=r"(r) : "l"(p));
    asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
    // asm("red.global.add.f32 [%0], %1;" :: "l"(p), "f"(v));
    const char* s = "red.global.add.f32";
}

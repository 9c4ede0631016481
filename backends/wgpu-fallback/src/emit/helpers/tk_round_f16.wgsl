// The nearest f16 (ties to even) of x, as an f32.
fn tk_round_f16(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    let s = b & 0x80000000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) { return x; }
    if (a >= 0x477ff000u) { return bitcast<f32>(s | 0x7f800000u); }
    if (a < 0x38800000u) {
        let q = round(abs(x) * 16777216.0f) / 16777216.0f;
        return bitcast<f32>(s | bitcast<u32>(q));
    }
    return bitcast<f32>(s | ((a + 0xfffu + ((a >> 13u) & 1u)) & 0xffffe000u));
}

// The nearest bf16 (ties to even) of x, as an f32.
fn tk_round_bf16(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) { return x; }
    return bitcast<f32>((b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u);
}

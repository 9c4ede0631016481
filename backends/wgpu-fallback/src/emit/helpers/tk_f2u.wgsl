// Truncates toward zero, saturating; NaN gives 0.
fn tk_f2u(x: f32) -> u32 {
    if (tk_isnan(x) || x <= 0.0f) { return 0u; }
    if (x >= 4294967296.0f) { return 4294967295u; }
    return u32(x);
}

// Truncates toward zero, saturating; NaN gives 0.
fn tk_f2i(x: f32) -> i32 {
    if (tk_isnan(x)) { return 0i; }
    if (x >= 2147483648.0f) { return 2147483647i; }
    if (x <= -2147483648.0f) { return i32(-2147483648); }
    return i32(x);
}

//! The helper functions a module may call (`tk_*`: NaN-propagating `max`/`min`, 16-bit float
//! rounding, saturating float-to-integer casts, integer division by zero, ...) and the accurate
//! maths functions (`crate::libm`): each written once per module, only where the module calls it
//! (`header.rs` writes them). The longer helpers are WGSL files in `helpers/`.

use tessel_plugin_api::libm;

use super::Writer;

/// Helper functions a module may need, emitted once each.
pub(super) const HELPERS: &[(&str, &str)] = &[
    ("tk_f32_bits", "fn tk_f32_bits(b: u32) -> f32 { return bitcast<f32>(b | tk_zero); }"),
    ("tk_isnan", "fn tk_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }"),
    (
        "tk_isnan4",
        "fn tk_isnan4(q: vec4<f32>) -> bool { return any((bitcast<vec4<u32>>(q) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u)); }",
    ),
    (
        "tk_max",
        "fn tk_max(a: f32, b: f32) -> f32 { return select(max(a, b), tk_f32_bits(0x7fc00000u), tk_isnan(a) | tk_isnan(b)); }",
    ),
    (
        "tk_min",
        "fn tk_min(a: f32, b: f32) -> f32 { return select(min(a, b), tk_f32_bits(0x7fc00000u), tk_isnan(a) | tk_isnan(b)); }",
    ),
    ("tk_round_f16", include_str!("helpers/tk_round_f16.wgsl").trim_ascii_end()),
    ("tk_round_bf16", include_str!("helpers/tk_round_bf16.wgsl").trim_ascii_end()),
    ("tk_div_i32", "fn tk_div_i32(a: i32, b: i32) -> i32 { if (b == 0i) { return 0i; } return a / b; }"),
    ("tk_rem_i32", "fn tk_rem_i32(a: i32, b: i32) -> i32 { if (b == 0i || b == -1i) { return 0i; } return a - (a / b) * b; }"),
    // Floored, as a computed block index divides (`tessel_plugin_api::ir::index::IndexEval`).
    (
        "tk_fdiv_i32",
        "fn tk_fdiv_i32(a: i32, b: i32) -> i32 { if (b == 0i) { return 0i; } let q = a / b; return select(q, q - 1i, a != q * b && ((a < 0i) != (b < 0i))); }",
    ),
    (
        "tk_frem_i32",
        "fn tk_frem_i32(a: i32, b: i32) -> i32 { if (b == 0i) { return 0i; } let r = a - (a / b) * b; return select(r, r + b, r != 0i && ((r < 0i) != (b < 0i))); }",
    ),
    ("tk_cdiv_i32", "fn tk_cdiv_i32(a: i32, b: i32) -> i32 { return tk_fdiv_i32(a, b) + select(0i, 1i, tk_frem_i32(a, b) != 0i); }"),
    ("tk_div_u32", "fn tk_div_u32(a: u32, b: u32) -> u32 { if (b == 0u) { return 0u; } return a / b; }"),
    ("tk_rem_u32", "fn tk_rem_u32(a: u32, b: u32) -> u32 { if (b == 0u) { return 0u; } return a % b; }"),
    ("tk_f2i", include_str!("helpers/tk_f2i.wgsl").trim_ascii_end()),
    ("tk_f2u", include_str!("helpers/tk_f2u.wgsl").trim_ascii_end()),
    ("tk_f16_bits", "fn tk_f16_bits(x: f32) -> u32 { return pack2x16float(vec2<f32>(x, 0.0f)) & 0xffffu; }"),
    // WGSL has no high half of a product: four 16-bit partial products. The maths functions of
    // `crate::libm` call it.
    ("tk_mulhi", include_str!("helpers/tk_mulhi.wgsl").trim_ascii_end()),
];

/// Which helpers each helper calls.
fn helper_deps(name: &str) -> &'static [&'static str] {
    match name {
        "tk_isnan" => &[],
        "tk_max" | "tk_min" => &["tk_isnan", "tk_f32_bits"],
        "tk_f2i" | "tk_f2u" => &["tk_isnan"],
        "tk_cdiv_i32" => &["tk_fdiv_i32", "tk_frem_i32"],
        _ => &[],
    }
}

impl<'k> Writer<'k> {
    pub(super) fn helper(&mut self, name: &'static str) {
        for d in helper_deps(name) {
            self.helpers.insert(d);
        }
        self.helpers.insert(name);
    }

    /// A call of an accurate maths function (`tessel_plugin_api::libm`), written once per module.
    pub(super) fn call(&mut self, f: fn() -> &'static libm::Func, args: &[&str]) -> String {
        let func = f();
        let name = func.name;
        self.libm.entry(name).or_insert_with(|| crate::libm::function(func));
        format!("{name}({})", args.join(", "))
    }
}

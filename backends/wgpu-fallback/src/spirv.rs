//! WGSL to SPIR-V that keeps IEEE-754's infinities, NaN and signed zeros.
//!
//! Vulkan lets a driver assume that no float operation sees or makes an infinity, a NaN or a
//! negative zero unless the entry point declares the `SignedZeroInfNanPreserve` execution mode
//! (`SPV_KHR_float_controls`). Without it Mesa folds `x / 0.0` to 0 and `x * 0.0` to 0 for every
//! `x`, which the language forbids. naga does not declare the mode, so on Vulkan the backend
//! writes the SPIR-V itself with naga, adds the capability, the extension and the execution mode,
//! and hands the words to wgpu as a passthrough shader. Other APIs take the WGSL as it is.

/// SPIR-V opcodes and enumerants used here (SPIR-V 1.0 specification, `SPV_KHR_float_controls`).
const OP_EXTENSION: u32 = 10;
const OP_EXT_INST_IMPORT: u32 = 11;
const OP_MEMORY_MODEL: u32 = 14;
const OP_ENTRY_POINT: u32 = 15;
const OP_EXECUTION_MODE: u32 = 16;
const OP_CAPABILITY: u32 = 17;
const OP_DECORATE: u32 = 71;
const DECORATION_NO_CONTRACTION: u32 = 42;
const CAPABILITY_SIGNED_ZERO_INF_NAN_PRESERVE: u32 = 4466;
/// Float arithmetic and comparisons (`OpFNegate` to `OpFMod`, `OpIsNan`, `OpIsInf`, the float
/// comparisons) and extended instructions (`fma`, `sqrt`, ...), each with its result id in word 2.
fn is_float_alu(op: u32) -> bool {
    matches!(op, 12 | 127 | 129 | 131 | 133 | 136 | 140 | 141 | 156 | 157 | 180..=191)
}
const EXECUTION_MODE_SIGNED_ZERO_INF_NAN_PRESERVE: u32 = 4461;

/// The SPIR-V of a WGSL compute module, with `SignedZeroInfNanPreserve` for 32-bit floats on
/// every entry point.
pub fn ieee_spirv(wgsl: &str) -> Result<Vec<u32>, String> {
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| e.emit_to_string(wgsl))?;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::default())
        .validate(&module)
        .map_err(|e| e.emit_to_string(wgsl))?;
    let options = naga::back::spv::Options {
        // Without a binding map naga writes each `@group(g) @binding(b)` as descriptor set `g`,
        // binding `b`: the layout the runtime makes.
        fake_missing_bindings: true,
        flags: naga::back::spv::WriterFlags::empty(),
        // Buffers are not clamped: every Vulkan implementation supports `robustBufferAccess`
        // (a required feature) and wgpu enables it on every device it opens, so no access leaves
        // its buffer without a clamp; the writer guards the accesses whose value matters (ragged
        // blocks). A clamp on every access cost 6-8% of a 16M-element add on lavapipe. Arrays
        // in private and workgroup memory have no such guarantee: their indices stay clamped.
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: naga::proc::BoundsCheckPolicy::Restrict,
            buffer: naga::proc::BoundsCheckPolicy::Unchecked,
            image_load: naga::proc::BoundsCheckPolicy::Restrict,
            binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
        },
        ..Default::default()
    };
    let words = naga::back::spv::write_vec(&module, &info, &options, None).map_err(|e| e.to_string())?;
    Ok(preserve_inf_nan(&words))
}

/// Adds the capability, extension and execution mode to a SPIR-V module (header and
/// instruction order as the specification's logical layout requires).
fn preserve_inf_nan(words: &[u32]) -> Vec<u32> {
    const HEADER: usize = 5;
    let exact = float_results(words);
    let mut out = words[..HEADER].to_vec();
    let mut added_decorations = false;
    let mut entry_points = Vec::new();
    let mut added_capability = false;
    let mut added_modes = false;
    let mut at = HEADER;
    while at < words.len() {
        let (count, op) = ((words[at] >> 16) as usize, words[at] & 0xffff);
        let ins = &words[at..at + count.max(1)];
        if !added_capability && op != OP_CAPABILITY {
            out.extend([(2 << 16) | OP_CAPABILITY, CAPABILITY_SIGNED_ZERO_INF_NAN_PRESERVE]);
            out.extend(extension("SPV_KHR_float_controls"));
            added_capability = true;
        }
        if op == OP_ENTRY_POINT {
            entry_points.push(ins[2]);
        }
        if !added_modes && !entry_points.is_empty() && !matches!(op, OP_ENTRY_POINT | OP_EXECUTION_MODE) {
            for &id in &entry_points {
                out.extend([(4 << 16) | OP_EXECUTION_MODE, id, EXECUTION_MODE_SIGNED_ZERO_INF_NAN_PRESERVE, 32]);
            }
            added_modes = true;
        }
        if !added_decorations && op == OP_DECORATE {
            for &id in &exact {
                out.extend([(3 << 16) | OP_DECORATE, id, DECORATION_NO_CONTRACTION]);
            }
            added_decorations = true;
        }
        debug_assert!(added_capability || !matches!(op, OP_EXTENSION | OP_EXT_INST_IMPORT | OP_MEMORY_MODEL));
        out.extend_from_slice(ins);
        at += count.max(1);
    }
    out
}

/// The result ids of float operations, which the driver must compute exactly as written:
/// `NoContraction` is what makes Mesa's NIR treat an operation as exact, so that it neither
/// folds `x * 0.0` to 0 nor `x - x` to 0 nor fuses a multiply and an add. (Mesa 22.3's lavapipe
/// honours it, though not the execution mode.)
fn float_results(words: &[u32]) -> Vec<u32> {
    let mut ids = Vec::new();
    let mut at = 5;
    while at < words.len() {
        let (count, op) = ((words[at] >> 16) as usize, words[at] & 0xffff);
        if is_float_alu(op) && count > 2 {
            ids.push(words[at + 2]);
        }
        at += count.max(1);
    }
    ids
}

/// `OpExtension "name"`: the name as nul-terminated UTF-8, packed into little-endian words.
fn extension(name: &str) -> Vec<u32> {
    let mut bytes = name.as_bytes().to_vec();
    bytes.push(0);
    bytes.resize(bytes.len().div_ceil(4) * 4, 0);
    let text: Vec<u32> = bytes.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let mut ins = vec![((1 + text.len() as u32) << 16) | OP_EXTENSION];
    ins.extend(text);
    ins
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_is_declared_once_per_entry_point_after_its_local_size() {
        let words = ieee_spirv("@compute @workgroup_size(4) fn main() {}").expect("compiles");
        let ops: Vec<(u32, Vec<u32>)> = {
            let mut v = Vec::new();
            let mut at = 5;
            while at < words.len() {
                let count = (words[at] >> 16) as usize;
                v.push((words[at] & 0xffff, words[at + 1..at + count].to_vec()));
                at += count;
            }
            v
        };
        let caps: Vec<u32> = ops.iter().filter(|(op, _)| *op == OP_CAPABILITY).map(|(_, a)| a[0]).collect();
        assert!(caps.contains(&CAPABILITY_SIGNED_ZERO_INF_NAN_PRESERVE), "{caps:?}");
        let modes: Vec<&Vec<u32>> = ops.iter().filter(|(op, _)| *op == OP_EXECUTION_MODE).map(|(_, a)| a).collect();
        assert_eq!(modes.len(), 2, "LocalSize and the float mode: {modes:?}");
        assert_eq!(modes[1][1..], [EXECUTION_MODE_SIGNED_ZERO_INF_NAN_PRESERVE, 32]);
        // Logical layout: capabilities, then extensions, then the rest.
        let first_ext = ops.iter().position(|(op, _)| *op == OP_EXTENSION).expect("extension");
        let last_cap = ops.iter().rposition(|(op, _)| *op == OP_CAPABILITY).unwrap();
        assert_eq!(first_ext, last_cap + 1);
        assert_eq!(extension("SPV_KHR_float_controls").len(), 1 + 6);
    }
}

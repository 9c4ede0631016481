//! The limits the wgpu lowering holds to — WebGPU's defaults, so that what the plan (`lower/`)
//! accepts and the writer (`emit/`) writes runs on every adapter — and the dtypes it lowers.
//! Imports nothing of this crate: `lib.rs`, the plan and the writer all read it. The public ones
//! are also `tessel_wgpu::emit::*`, where they were first.

use tessel_plugin_api::ir::DType;

/// The largest block value lowered, in elements.
pub const MAX_BLOCK_ELEMENTS: usize = 1 << 16;
/// The most statements (nested ones included) of a kernel lowered. naga's WGSL front end
/// resolves types in time quadratic in a shader function's length (`Typifier::grow` walks the
/// expressions from the start on each call): a chain of 16,000 `add`s took 23 s to compile on
/// lavapipe, 50,000 took 207 s. The interpreter's compile is linear in the kernel's length.
pub const MAX_STATEMENTS: usize = 16_384;
/// The most parallel programs (or `seq` steps) one launch runs: the counters are `u32`.
pub const MAX_PROGRAMS: u64 = 1 << 31;
/// Workgroups dispatched at most: WebGPU's default `maxComputeWorkgroupsPerDimension`.
pub const MAX_GROUPS: u64 = 65_535;
/// WebGPU's default `maxStorageBufferBindingSize`: the workspace is sized to fit it.
pub const WORKSPACE_BUDGET: u64 = 128 << 20;
/// The most storage bindings a module uses: WebGPU's default `maxStorageBuffersPerShaderStage`
/// (`vec4` views of inputs are added only while they fit; arguments and the workspace always).
pub(crate) const MAX_STORAGE_BINDINGS: usize = 8;
/// The most words a staged `dot` keeps in workgroup memory (both operand chunks): half of
/// WebGPU's default `maxComputeWorkgroupStorageSize` of 16 KiB.
pub(crate) const MAX_STAGED_WORDS: usize = 2048;
/// The most invocations per workgroup used: WebGPU's default `maxComputeInvocationsPerWorkgroup`.
pub const MAX_WORKGROUP: u32 = 256;

/// The dtypes this backend lowers (16-bit floats emulated with `f32` and rounding, 8- and 16-bit
/// integers held in 32 bits and wrapped).
pub const DTYPES: [DType; 10] = DType::ALL;

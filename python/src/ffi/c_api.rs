//! The structs of XLA's FFI C API that the handler reads, declared by hand from `c_api.h`
//! (API version 0.3; every field the handler touches is in 0.1 already). Their sizes and field
//! offsets are pinned by `python/tests/test_jax.py`, which compiles the header.

use std::ffi::{c_char, c_void};

/// `XLA_FFI_Extension_Type`: the one kind of extension a handler is handed.
pub const EXTENSION_METADATA: i32 = 1;
/// `XLA_FFI_ExecutionStage_EXECUTE`.
pub const STAGE_EXECUTE: i32 = 3;
/// `XLA_FFI_ArgType_BUFFER` and `XLA_FFI_RetType_BUFFER`.
pub const BUFFER: i32 = 1;
/// `XLA_FFI_AttrType_STRING`.
pub const ATTR_STRING: i32 = 4;
/// `XLA_FFI_Error_Code_INVALID_ARGUMENT`, `_RESOURCE_EXHAUSTED`, `_UNIMPLEMENTED`,
/// `_INTERNAL`, `_UNAVAILABLE` (absl's status codes).
pub const INVALID_ARGUMENT: i32 = 3;
pub const RESOURCE_EXHAUSTED: i32 = 8;
pub const UNIMPLEMENTED: i32 = 12;
pub const INTERNAL: i32 = 13;
pub const UNAVAILABLE: i32 = 14;
/// The API version the handler declares: the oldest with everything it uses.
pub const API_MAJOR: i32 = 0;
pub const API_MINOR: i32 = 1;

#[repr(C)]
pub struct ExtensionBase {
    pub struct_size: usize,
    pub ty: i32,
    pub next: *mut ExtensionBase,
}

#[repr(C)]
pub struct ApiVersion {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub major_version: i32,
    pub minor_version: i32,
}

#[repr(C)]
pub struct ErrorCreateArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub message: *const c_char,
    pub errc: i32,
}

/// An opaque `XLA_FFI_Error`.
pub type FfiError = c_void;

#[repr(C)]
pub struct Buffer {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub dtype: i32,
    pub data: *mut c_void,
    pub rank: i64,
    pub dims: *const i64,
}

#[repr(C)]
pub struct ByteSpan {
    pub ptr: *const c_char,
    pub len: usize,
}

/// `XLA_FFI_Args` and `XLA_FFI_Rets`: the same layout.
#[repr(C)]
pub struct Buffers {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub size: i64,
    pub types: *const i32,
    pub buffers: *const *mut Buffer,
}

#[repr(C)]
pub struct Attrs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub size: i64,
    pub types: *const i32,
    pub names: *const *const ByteSpan,
    pub attrs: *const *const c_void,
}

#[repr(C)]
pub struct CallFrame {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub api: *const Api,
    pub ctx: *mut c_void,
    pub stage: i32,
    pub args: Buffers,
    pub rets: Buffers,
    pub attrs: Attrs,
    pub future: *mut c_void,
}

/// The head of `XLA_FFI_Api`, up to the functions the handler calls.
#[repr(C)]
pub struct Api {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub api_version: ApiVersion,
    pub internal_api: *const c_void,
    pub error_create: Option<unsafe extern "C" fn(*mut ErrorCreateArgs) -> *mut FfiError>,
    pub error_get_message: *const c_void,
    pub error_destroy: *const c_void,
    pub handler_register: *const c_void,
    pub stream_get: Option<unsafe extern "C" fn(*mut StreamGetArgs) -> *mut FfiError>,
}

/// `XLA_FFI_Stream_Get_Args`: the call's stream (a `CUstream` on CUDA), asked of XLA.
#[repr(C)]
pub struct StreamGetArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub ctx: *mut c_void,
    pub stream: *mut c_void,
}

#[repr(C)]
pub struct Metadata {
    pub struct_size: usize,
    pub api_version: ApiVersion,
    pub traits: u32,
    pub state_type_id: i64,
}

#[repr(C)]
pub struct MetadataExtension {
    pub extension_base: ExtensionBase,
    pub metadata: *mut Metadata,
}

/// XLA's `XLA_FFI_DataType` of each dtype tessel has.
pub fn dtype(code: i32) -> Option<tessel_plugin_api::ir::DType> {
    use tessel_plugin_api::ir::DType;
    Some(match code {
        1 => DType::Bool,
        2 => DType::I8,
        3 => DType::I16,
        4 => DType::I32,
        6 => DType::U8,
        7 => DType::U16,
        8 => DType::U32,
        10 => DType::F16,
        11 => DType::F32,
        16 => DType::BF16,
        _ => return None,
    })
}

/// Every struct above, by its name in `c_api.h`: its size and each field's offset, which
/// the tests compare with what a C compiler makes of the header.
pub fn layout() -> Vec<(&'static str, usize, Vec<(&'static str, usize)>)> {
    use std::mem::{offset_of, size_of};
    macro_rules! s {
        ($c:literal, $t:ty, [$($cf:literal = $f:ident),*]) => {
            ($c, size_of::<$t>(), vec![$(($cf, offset_of!($t, $f))),*])
        };
    }
    vec![
        s!("XLA_FFI_Extension_Base", ExtensionBase, ["struct_size" = struct_size, "type" = ty, "next" = next]),
        s!(
            "XLA_FFI_Api_Version",
            ApiVersion,
            [
                "struct_size" = struct_size,
                "extension_start" = extension_start,
                "major_version" = major_version,
                "minor_version" = minor_version
            ]
        ),
        s!(
            "XLA_FFI_Error_Create_Args",
            ErrorCreateArgs,
            ["struct_size" = struct_size, "extension_start" = extension_start, "message" = message, "errc" = errc]
        ),
        s!(
            "XLA_FFI_Buffer",
            Buffer,
            [
                "struct_size" = struct_size,
                "extension_start" = extension_start,
                "dtype" = dtype,
                "data" = data,
                "rank" = rank,
                "dims" = dims
            ]
        ),
        s!("XLA_FFI_ByteSpan", ByteSpan, ["ptr" = ptr, "len" = len]),
        s!(
            "XLA_FFI_Args",
            Buffers,
            [
                "struct_size" = struct_size,
                "extension_start" = extension_start,
                "size" = size,
                "types" = types,
                "args" = buffers
            ]
        ),
        s!(
            "XLA_FFI_Rets",
            Buffers,
            [
                "struct_size" = struct_size,
                "extension_start" = extension_start,
                "size" = size,
                "types" = types,
                "rets" = buffers
            ]
        ),
        s!(
            "XLA_FFI_Attrs",
            Attrs,
            [
                "struct_size" = struct_size,
                "extension_start" = extension_start,
                "size" = size,
                "types" = types,
                "names" = names,
                "attrs" = attrs
            ]
        ),
        s!(
            "XLA_FFI_CallFrame",
            CallFrame,
            [
                "struct_size" = struct_size,
                "extension_start" = extension_start,
                "api" = api,
                "ctx" = ctx,
                "stage" = stage,
                "args" = args,
                "rets" = rets,
                "attrs" = attrs,
                "future" = future
            ]
        ),
        s!(
            "XLA_FFI_Metadata",
            Metadata,
            ["struct_size" = struct_size, "api_version" = api_version, "traits" = traits, "state_type_id" = state_type_id]
        ),
        s!(
            "XLA_FFI_Stream_Get_Args",
            StreamGetArgs,
            ["struct_size" = struct_size, "extension_start" = extension_start, "ctx" = ctx, "stream" = stream]
        ),
        s!("XLA_FFI_Metadata_Extension", MetadataExtension, ["extension_base" = extension_base, "metadata" = metadata]),
        // Only the head of XLA_FFI_Api is declared: its fields' offsets are what matter.
        (
            "XLA_FFI_Api",
            0,
            vec![
                ("struct_size", offset_of!(Api, struct_size)),
                ("api_version", offset_of!(Api, api_version)),
                ("internal_api", offset_of!(Api, internal_api)),
                ("XLA_FFI_Error_Create", offset_of!(Api, error_create)),
                ("XLA_FFI_Stream_Get", offset_of!(Api, stream_get)),
            ],
        ),
    ]
}

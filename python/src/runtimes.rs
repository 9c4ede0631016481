//! The runtimes the module's calls share, made as each call's backend needs them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use tessel::{Error, Runtime};
use tessel_plugin_api::abi::ErrorKind;

/// The runtimes calls share, by which plugins of `TESSEL_PLUGIN_PATH` they load, and the plugins
/// `load_plugin` added (a new plugin makes new runtimes with all of them; launches in flight keep
/// the one they started with). As in the CLI, a library on the path is loaded only by a call that
/// may need it: a call naming a built-in backend loads none of them (one that crashes while
/// loading cannot take down `interpret` or `wgpu`), a call naming a plugin's backend loads them
/// in order until one provides it, `auto` and the list of backends load every one.
struct State {
    runtimes: BTreeMap<Reach, Arc<Runtime>>,
    plugins: Vec<PathBuf>,
}

/// Which plugins of `TESSEL_PLUGIN_PATH` a runtime loads.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Reach {
    /// None: every built-in backend is there without them.
    Builtins,
    /// Those up to the one providing this backend.
    Named(String),
    /// All of them.
    Every,
}

static STATE: RwLock<State> = RwLock::new(State { runtimes: BTreeMap::new(), plugins: Vec::new() });

/// The runtime for a call on `backend` (a name, or `auto`).
pub(crate) fn runtime(backend: &str) -> Result<Arc<Runtime>, Error> {
    static BUILTINS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let builtins = BUILTINS.get_or_init(|| tessel::registry::Registry::builtins().backends.iter().map(|b| b.name.clone()).collect());
    // Without plugins on the path, every call shares one runtime (one wgpu device, one set of
    // plans); a name nobody provides is then refused by that one. The path is read once, as the
    // module read it once when it made its one runtime at the first call (not on every call of
    // the XLA handler).
    static PATH: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let path = *PATH.get_or_init(|| {
        std::env::var_os("TESSEL_PLUGIN_PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| !d.as_os_str().is_empty()))
    });
    let reach = match backend {
        _ if !path => Reach::Builtins,
        "auto" => Reach::Every,
        b if builtins.iter().any(|n| n == b) => Reach::Builtins,
        b => Reach::Named(b.to_string()),
    };
    if let Some(rt) = STATE.read().ok().and_then(|s| s.runtimes.get(&reach).cloned()) {
        return Ok(rt);
    }
    let mut s = STATE.write().map_err(|_| poisoned())?;
    if let Some(rt) = s.runtimes.get(&reach) {
        return Ok(Arc::clone(rt));
    }
    let named = match &reach {
        Reach::Builtins => builtins.first().map(String::as_str),
        Reach::Named(b) => Some(b.as_str()),
        Reach::Every => None,
    };
    let rt = Arc::new(Runtime::for_backend(&s.plugins, named)?);
    // A name no plugin provides (a typo) gets its refusal from this runtime, which is not kept:
    // one runtime per wrong name would each hold every plugin of the path.
    if named.is_none_or(|n| rt.registry().get(n).is_some()) {
        s.runtimes.insert(reach, Arc::clone(&rt));
    }
    Ok(rt)
}

pub(crate) fn poisoned() -> Error {
    Error::Backend {
        backend: "tessel".into(),
        kind: ErrorKind::Internal,
        message: "tessel's runtime is unusable after an earlier panic".into(),
    }
}

/// Adds a plugin (`tessel.load_plugin`): loaded now, so that one that fails is an error here
/// (the path's plugins are not); the runtimes made before are dropped, launches in flight keep
/// theirs.
pub(crate) fn load_plugin(path: PathBuf) -> Result<(), Error> {
    let mut s = STATE.write().map_err(|_| poisoned())?;
    let mut plugins = s.plugins.clone();
    if !plugins.contains(&path) {
        plugins.push(path);
    }
    let rt = Runtime::for_backend(&plugins, Some("interpret"))?;
    s.plugins = plugins;
    s.runtimes = BTreeMap::from([(Reach::Builtins, Arc::new(rt))]);
    Ok(())
}

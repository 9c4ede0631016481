//! Meshes in their portable form: a kind and named axes with sizes and roles, written
//! `KIND(NAME: SIZE [cluster|thread], ...)` (docs/language.md §4).

use std::fmt;

/// What an axis of a mesh is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AxisRole {
    /// A grid axis: programs.
    Grid,
    /// A cluster axis (Mosaic GPU): CTAs that share distributed shared memory.
    Cluster,
    /// A thread axis (Mosaic GPU): warpgroups inside one program.
    Thread,
}

impl AxisRole {
    /// The word after the size in text (`""` for a grid axis).
    pub fn keyword(self) -> &'static str {
        match self {
            AxisRole::Grid => "",
            AxisRole::Cluster => "cluster",
            AxisRole::Thread => "thread",
        }
    }
}

/// One named axis of a mesh.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MeshAxis {
    /// Axis name.
    pub name: String,
    /// Number of points.
    pub size: u64,
    /// Its role.
    pub role: AxisRole,
}

/// A mesh in portable form, as shared launch code writes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MeshSpec {
    /// `grid`, `device`, `mosaic_gpu`, `wgpu`, or a kind a plugin registers.
    pub kind: String,
    /// The axes in order.
    pub axes: Vec<MeshAxis>,
}

/// A mesh text that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "bad mesh `{}`: {why}\n  expected KIND(NAME: SIZE [cluster|thread], ...), such as `grid(i: 4, j: 2)` or `mosaic_gpu(i: 4, c: 2 cluster, wg: 2 thread)`",
    crate::clip::clip(text)
)]
pub struct MeshParseError {
    /// The text given.
    pub text: String,
    /// What is wrong with it.
    pub why: String,
}

/// The most axes a mesh has: far past any machine's (a mesh's programs are the product of its
/// sizes), and few enough that a message naming the mesh stays readable.
pub const MAX_MESH_AXES: usize = 64;

fn is_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_') && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

impl MeshSpec {
    /// Parses `KIND(NAME: SIZE [cluster|thread], ...)`.
    pub fn parse(text: &str) -> Result<MeshSpec, MeshParseError> {
        let err = |why: String| MeshParseError { text: text.to_string(), why: crate::clip::clip(&why).into_owned() };
        let t = text.trim();
        let open = t.find('(').ok_or_else(|| err("there is no `(` after the kind".into()))?;
        let kind = t[..open].trim();
        if !is_name(kind) {
            return Err(err(format!("`{kind}` is not a mesh kind name")));
        }
        let inner = t[open + 1..].strip_suffix(')').ok_or_else(|| err("it does not end with `)`".into()))?;
        let mut axes: Vec<MeshAxis> = Vec::new();
        let parts = inner.split(',').map(str::trim).filter(|p| !p.is_empty());
        let count = parts.clone().count();
        if count > MAX_MESH_AXES {
            return Err(err(format!("it has {count} axes, more than the {MAX_MESH_AXES} a mesh may have")));
        }
        for part in parts {
            let (name, rest) = part.split_once(':').ok_or_else(|| err(format!("axis `{part}` has no `: SIZE`")))?;
            let name = name.trim();
            if !is_name(name) {
                return Err(err(format!("`{name}` is not an axis name")));
            }
            let mut words = rest.split_whitespace();
            let size_text = words.next().ok_or_else(|| err(format!("axis `{name}` has no size")))?;
            let size: u64 =
                size_text.parse().map_err(|_| err(format!("the size of `{name}`, `{size_text}`, is not a positive integer")))?;
            if size == 0 {
                return Err(err(format!("axis `{name}` has size 0")));
            }
            let role = match words.next() {
                None => AxisRole::Grid,
                Some("cluster") => AxisRole::Cluster,
                Some("thread") => AxisRole::Thread,
                Some(w) => return Err(err(format!("`{w}` after the size of `{name}` is neither `cluster` nor `thread`"))),
            };
            if let Some(w) = words.next() {
                return Err(err(format!("unexpected `{w}` in axis `{name}`")));
            }
            if axes.iter().any(|a| a.name == name) {
                return Err(err(format!("axis `{name}` appears twice")));
            }
            axes.push(MeshAxis { name: name.to_string(), size, role });
        }
        Ok(MeshSpec { kind: kind.to_string(), axes })
    }

    /// The axes of one role, in order.
    pub fn axes_of(&self, role: AxisRole) -> impl Iterator<Item = &MeshAxis> {
        self.axes.iter().filter(move |a| a.role == role)
    }
}

impl fmt::Display for MeshSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(", self.kind)?;
        for (n, a) in self.axes.iter().enumerate() {
            if n > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}: {}", a.name, a.size)?;
            if a.role != AxisRole::Grid {
                write!(f, " {}", a.role.keyword())?;
            }
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_roles() {
        let m = MeshSpec::parse(" mosaic_gpu(i: 4, j: 2,c: 2 cluster, wg: 2 thread) ").expect("valid");
        assert_eq!(m.to_string(), "mosaic_gpu(i: 4, j: 2, c: 2 cluster, wg: 2 thread)");
        assert_eq!(m.axes_of(AxisRole::Cluster).count(), 1);
        assert_eq!(MeshSpec::parse("grid()").expect("empty").axes.len(), 0);
    }

    #[test]
    fn a_mesh_of_too_many_axes_is_refused_and_quoted_short() {
        let axes = |n: usize| (0..n).map(|i| format!("a{i}: 1")).collect::<Vec<_>>().join(", ");
        assert!(MeshSpec::parse(&format!("grid({})", axes(MAX_MESH_AXES))).is_ok());
        let text = format!("grid({})", axes(10_000));
        let e = MeshSpec::parse(&text).expect_err("10,000 axes");
        assert_eq!(e.why, "it has 10000 axes, more than the 64 a mesh may have");
        let shown = e.to_string();
        assert!(shown.len() < 600 && shown.contains(&format!("({} bytes in all)", text.len())), "{shown}");
    }

    #[test]
    fn errors_say_what_is_wrong() {
        for (text, why) in [
            ("grid", "no `(`"),
            ("grid(i: 4", "does not end with `)`"),
            ("grid(i 4)", "has no `: SIZE`"),
            ("grid(i: 0)", "size 0"),
            ("grid(i: x)", "not a positive integer"),
            ("grid(i: 2 warp)", "neither `cluster` nor `thread`"),
            ("grid(i: 2, i: 3)", "appears twice"),
            ("9d(i: 2)", "not a mesh kind"),
        ] {
            let e = MeshSpec::parse(text).expect_err(text).to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}

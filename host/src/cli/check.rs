//! The commands that check without launching a kernel of the user's: `tessel check` (a file
//! parsed and verified) and `tessel conformance` (the standard suite against a backend).

use std::io::Write;
use std::path::Path;

use super::prepare::parse_params;
use crate::{Error, Result, Runtime};

pub(super) fn conformance(rt: &Runtime, backend: &str, out: &mut dyn Write) -> Result<()> {
    let rows = crate::conformance::run(rt, backend)?;
    let (table, ok) = crate::conformance::table(backend, &rows);
    let _ = write!(out, "{table}");
    let failed = rows.iter().filter(|r| matches!(r.verdict, crate::conformance::Verdict::Fail(_))).count();
    if ok { Ok(()) } else { Err(Error::ConformanceFailed { backend: backend.to_string(), failed }) }
}

pub(super) fn check(file: &Path, params: &[String], out: &mut dyn Write) -> Result<()> {
    let text = crate::read_kernel_text(file)?;
    let checked = crate::check_source(&file.display().to_string(), &text, &parse_params(params)?)?;
    let texts: Vec<String> = checked
        .iter()
        .map(|(text, how)| match how {
            crate::Checked::Verified(None) => text.clone(),
            crate::Checked::Verified(Some(values)) => format!("{text}# verified with {values}\n"),
            crate::Checked::Unbound(names) => format!(
                "{text}# names and syntax checked; not verified: no value for {} (give --param {}=V)\n",
                names.join(", "),
                names[0]
            ),
        })
        .collect();
    let _ = write!(out, "{}", texts.join("\n"));
    Ok(())
}

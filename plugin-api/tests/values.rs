//! The verified kernel's accessors from statements and operands to their values' ids and types
//! agree with what the verifier wrote into each statement (`Stmt::ty`) and with the value table
//! by name, over every kernel file of the repository.

use std::path::Path;

use tessel_plugin_api::ir::*;

/// Every `.tk` file under `dir`, recursively.
fn tk_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a folder of kernels") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            tk_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "tk") {
            out.push(path);
        }
    }
}

#[test]
fn statements_reach_their_values_ids_and_types_without_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in ["examples", "tests/in", "tests/cases"] {
        tk_files(&root.join(dir), &mut files);
    }
    let (mut statements, mut operands) = (0, 0);
    for path in &files {
        let text = std::fs::read_to_string(path).expect("readable");
        // Files of deliberate errors, and generic kernels (verified once bound), are skipped.
        let Ok(module) = parse(&text) else { continue };
        for k in &module.kernels {
            let Ok(v) = verify(k) else { continue };
            analysis::visit(&v.kernel().body, &mut |s| {
                statements += 1;
                let ids = v.result_ids(s);
                assert_eq!(ids.len(), s.results.len(), "{}: {s:?}", path.display());
                for (id, name) in ids.iter().zip(&s.results) {
                    assert_eq!(v.values().name(*id), name);
                }
                assert_eq!(v.result(s), ids.first().copied());
                if s.op.has_single_result() {
                    assert_eq!(v.result_type(s), s.ty.as_ref(), "{}: {s:?}", path.display());
                }
                for name in analysis::reads(&s.op) {
                    operands += 1;
                    let o = Operand::value(name);
                    assert_eq!(v.operand_id(&o), Some(v.id(name)));
                    assert_eq!(v.operand_type(&o), Some(v.value_type(name)));
                }
            });
        }
    }
    assert_eq!(literal_id_and_type(), (None, None));
    assert!(statements > 1000 && operands > 1000, "{statements} statements, {operands} operands read");
}

/// A literal has no id and no type of its own.
fn literal_id_and_type() -> (Option<ValueId>, Option<Type>) {
    let k = &parse("kernel k\n  out o: f32[4]\n{\n  %z = zeros : f32[4]\n  store o, %z\n}\n").expect("parses").kernels[0];
    let v = verify(k).expect("verifies");
    let lit = Operand::Lit(Literal::Float(1.0));
    (v.operand_id(&lit), v.operand_type(&lit).cloned())
}

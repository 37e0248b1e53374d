//! The import rule of the crate's layers: a module imports only from its own layer and the
//! layers below it (see the crate's documentation for the list). Checked over the sources, so
//! `cargo test` fails on an import that runs the wrong way.

use std::path::{Path, PathBuf};

/// The layers, lowest first: each is a folder (or file) at the top of `src/`.
const LAYERS: [&str; 6] = ["base", "dataplane", "vips", "steering", "state", "serve"];

/// Files at the top of `src/` that are no layer: the crate root, this check, the binary.
const OUTSIDE: [&str; 4] = ["lib.rs", "layers.rs", "main.rs", "cli"];

fn layer_of(name: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == name)
}

/// The code of a source file that the rule covers: comments and the test module at its end
/// (`#[cfg(test)] mod ...`) removed. A whole test file (`tests.rs`, `*_tests.rs`) has none.
fn covered_code(path: &Path, text: &str) -> String {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if name == "tests.rs" || name.ends_with("_tests.rs") {
        return String::new();
    }
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        let line = line.split("//").next().unwrap_or_default();
        code.push_str(line);
        code.push('\n');
    }
    code
}

/// Each `crate::<layer>` the code names whose layer is above `own`, as "layer (line)".
fn upward_imports(own: usize, code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            match layer_of(&name) {
                Some(layer) if layer > own => found.push(format!("{name} (line {})", n + 1)),
                Some(_) => {}
                None => found.push(format!("{name}, which is no layer (line {})", n + 1)),
            }
        }
        if line.contains("super::super::") {
            found.push(format!("super::super:: (line {})", n + 1));
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn imports_run_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(&src).expect("src/") {
        let path = entry.expect("directory entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let top = name.trim_end_matches(".rs");
        if OUTSIDE.contains(&name) {
            continue;
        }
        let Some(own) = layer_of(top) else {
            wrong.push(format!(
                "src/{name} is in no layer: put it in one of {LAYERS:?}"
            ));
            continue;
        };
        let mut files = Vec::new();
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else {
            files.push(path.clone());
        }
        for file in files {
            let text = std::fs::read_to_string(&file).expect("source file");
            for import in upward_imports(own, &covered_code(&file, &text)) {
                let shown = file.strip_prefix(&src).unwrap_or(&file).display();
                wrong.push(format!("src/{shown} ({top}) imports crate::{import}"));
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} files checked");
    assert!(
        wrong.is_empty(),
        "imports that run up the layers {LAYERS:?}:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn an_upward_import_is_found_and_comments_and_tests_are_not() {
    let own = layer_of("vips").unwrap();
    let code = covered_code(
        Path::new("vips/x.rs"),
        "use crate::base::net::Protocol;\n\
         use crate::steering::policy::decide; // up\n\
         /// See [`crate::serve::api`].\n\
         fn f() { crate::dataplane::ebpf::load(); crate::state::metrics::x(); }\n\
         #[cfg(test)]\n\
         mod tests {\n    use crate::serve::api;\n}\n",
    );
    assert_eq!(
        upward_imports(own, &code),
        ["steering (line 2)", "state (line 4)"]
    );
    assert_eq!(
        upward_imports(own, "use crate::balancer::Vip;"),
        ["balancer, which is no layer (line 1)"]
    );
    assert!(covered_code(Path::new("vips/tests.rs"), "use crate::serve::api;").is_empty());
}

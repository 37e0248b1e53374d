//! The example config (`config/balancer.example.toml`) and the reference
//! (docs/user/configuration.md) list every key the code knows, each with the code's default: one
//! source of defaults, checked.

use super::*;

/// Flattens a config table into `section.key` → value: top-level keys, the `[section]`
/// tables, and for the arrays of tables (`[[vip]]`, `[[vip.backend]]`, ...) the first entry
/// that sets each key.
fn flatten(
    prefix: &str,
    table: &toml::Table,
    out: &mut std::collections::BTreeMap<String, toml::Value>,
) {
    for (key, value) in table {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            toml::Value::Table(t) => flatten(&path, t, out),
            toml::Value::Array(items)
                if items.iter().all(|i| i.is_table()) && !items.is_empty() =>
            {
                for item in items {
                    let mut one = std::collections::BTreeMap::new();
                    flatten(&path, item.as_table().unwrap(), &mut one);
                    for (k, v) in one {
                        out.entry(k).or_insert(v);
                    }
                }
            }
            _ => {
                out.entry(path).or_insert_with(|| value.clone());
            }
        }
    }
}

/// Checks that `example` lists every key the code knows and sets each to the code's default
/// (see the two tests below); returns the problems found.
fn defaults_problems(example: &str, choices: &[&str]) -> Vec<String> {
    // The code's defaults: a minimal config, written back with every key.
    let minimal = Config::parse(
        "interface = \"eth0\"\n[[vip]]\naddress = \"10.100.0.1\"\nport = 80\n\
         [[vip.backend]]\naddress = \"10.0.0.11\"\n",
    )
    .unwrap();
    let mut defaults = std::collections::BTreeMap::new();
    flatten(
        "",
        &toml::from_str(&minimal.to_toml()).unwrap(),
        &mut defaults,
    );
    let mut shown = std::collections::BTreeMap::new();
    flatten(
        "",
        &toml::from_str(example).expect("valid TOML"),
        &mut shown,
    );
    // Required keys have no default to compare with.
    let required = [
        "interface",
        "vip.address",
        "vip.port",
        "vip.backend.address",
    ];
    let mut problems = Vec::new();
    for (key, default) in &defaults {
        let name = key.rsplit('.').next().unwrap();
        // Written as `name = ...`, commented out or not, also inside an inline table.
        let listed = example.match_indices(name).any(|(i, _)| {
            let before = example[..i].chars().next_back();
            let after = example[i + name.len()..].trim_start_matches(' ');
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && after.starts_with('=')
        });
        if !listed {
            problems.push(format!("{key} (default {default}) is not in the example"));
            continue;
        }
        if required.contains(&key.as_str()) {
            continue;
        }
        match shown.get(key) {
            Some(v) if v != default && !choices.contains(&key.as_str()) => problems.push(format!(
                "{key}: the example sets {v}, the code's default is {default}"
            )),
            Some(v) if v == default && choices.contains(&key.as_str()) => problems.push(format!(
                "{key} is listed as a choice but shows the default {v}"
            )),
            _ => {}
        }
    }
    problems
}

#[test]
fn the_example_lists_every_key_with_the_codes_default() {
    // Keys the example sets to something other than the default on purpose, to show a choice;
    // each says its default in its comment.
    let choices = [
        "vip.name",
        "vip.health.check",
        "vip.telemetry.source",
        "vip.policy.kind",
        "vip.policy.min_free_gpu_memory_mib",
        "vip.policy.stale_after_ms",
    ];
    let problems = defaults_problems(
        include_str!("../../../../config/balancer.example.toml"),
        &choices,
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_configuration_reference_lists_every_key_with_the_codes_default() {
    let doc = include_str!("../../../../docs/user/configuration.md");
    let block = doc
        .split("```toml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a toml block in docs/user/configuration.md");
    let choices = [
        "vip.name",
        "vip.health.check",
        "vip.telemetry.source",
        "vip.policy.kind",
        "vip.policy.stale_after_ms",
    ];
    let problems = defaults_problems(block, &choices);
    assert!(
        problems.is_empty(),
        "docs/user/configuration.md:\n{}",
        problems.join("\n")
    );
}

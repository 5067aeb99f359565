//! The fleets tests start a stack on, and the rule that a fleet's nodes
//! declare what a production node enforces unless a test says otherwise.

/// Three nodes of three models in three zones.
pub const FLEET: &str = r#"
[[node]]
id = "node-a"
zone = "cn-north-1a"
hostname = "gpu-a.sim"
gpu_model = "A100-40GB"
gpu_count = 8
vram_gb = 40

[[node]]
id = "node-b"
zone = "cn-east-1b"
hostname = "gpu-b.sim"
gpu_model = "A10G-24GB"
gpu_count = 4
vram_gb = 24

[[node]]
id = "node-c"
zone = "cn-south-1c"
hostname = "gpu-c.sim"
gpu_model = "H100-80GB"
gpu_count = 8
vram_gb = 80
"#;

/// One node with two A100-40GB.
pub const TWO_A100: &str = r#"
[[node]]
id = "node-a"
zone = "cn-north-1a"
hostname = "gpu-a.sim"
gpu_model = "A100-40GB"
gpu_count = 2
vram_gb = 40
"#;

/// Two nodes of one A100 each, in one zone.
pub const TWO_NODES: &str = r#"
[[node]]
id = "node-a"
zone = "cn-north-1a"
hostname = "gpu-a.sim"
gpu_model = "A100-40GB"
gpu_count = 1
vram_gb = 40

[[node]]
id = "node-b"
zone = "cn-north-1a"
hostname = "gpu-b.sim"
gpu_model = "A100-40GB"
gpu_count = 1
vram_gb = 40
"#;

/// Nodes of one A100 each, in one zone, named `ids` (TWO_NODES is
/// `one_a100_each(&["node-a", "node-b"])`).
pub fn one_a100_each(ids: &[&str]) -> String {
    ids.iter()
        .map(|id| {
            let host = id.strip_prefix("node-").unwrap_or(id);
            format!(
                "\n[[node]]\nid = \"{id}\"\nzone = \"cn-north-1a\"\nhostname = \"gpu-{host}.sim\"\n\
                 gpu_model = \"A100-40GB\"\ngpu_count = 1\nvram_gb = 40\n"
            )
        })
        .collect()
}

/// `fleet` with every node that does not say otherwise declaring what a
/// production node enforces (containers, HAMi-core), as `dev/fleet.toml`
/// does: the tests of other rules place untrusted tenants' leases and GPU
/// shares on it. A test of those rules names `isolation` or `gpu_sharing`
/// on its nodes; a real runtime (`node_runtime`) declares its own anyway.
pub fn enforcing(fleet: &str) -> String {
    let mut out = String::with_capacity(fleet.len());
    let mut blocks = fleet.split("[[node]]");
    out.push_str(blocks.next().unwrap_or_default());
    for block in blocks {
        out.push_str("[[node]]\n");
        let names = |key: &str| {
            block
                .lines()
                .any(|l| l.trim_start().starts_with(key) && l.contains('='))
        };
        if !names("isolation") {
            out.push_str("isolation = \"container\"\n");
        }
        if !names("gpu_sharing") {
            out.push_str("gpu_sharing = \"hami-core\"\n");
        }
        out.push_str(block.strip_prefix('\n').unwrap_or(block));
    }
    out
}

pub(crate) fn toml_node_ids(fleet: &str) -> Vec<String> {
    fleet
        .lines()
        .filter_map(|l| l.trim().strip_prefix("id = \""))
        .map(|rest| rest.trim_end_matches('"').to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_a100_each_writes_two_nodes_as_the_constant_does() {
        assert_eq!(
            super::one_a100_each(&["node-a", "node-b"]),
            super::TWO_NODES
        );
    }

    use super::*;

    #[test]
    fn nodes_declare_full_enforcement_unless_they_say_otherwise() {
        let fleet = "# two\n[[node]]\nid = \"a\"\n\n[[node]]\nid = \"b\"\nisolation = \"none\"\n";
        assert_eq!(
            enforcing(fleet),
            "# two\n[[node]]\nisolation = \"container\"\ngpu_sharing = \"hami-core\"\nid = \"a\"\n\n\
             [[node]]\ngpu_sharing = \"hami-core\"\nid = \"b\"\nisolation = \"none\"\n"
        );
    }
}

//! What the node-agent on a GPU node needs of its pod: scheduling onto GPU
//! nodes only, the NVIDIA runtime and the environment NVML, MIG and MPS
//! need, and its state and NATS seed on the host so they outlive the pod.
//! It returns every problem rather than stopping at the first, so one run
//! of the check shows the whole gap.

use std::path::Path;

use serde_yaml_ng::Value;

use crate::k8s::env_value;
use crate::manifests::str_at;

/// What a GPU node's agent needs of its pod, per the manifests: where
/// problems are, empty when none.
pub fn gpu_node_agent_problems(agent: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let name = str_at(agent, &["metadata", "name"]).unwrap_or_default();
    let pod = &agent["spec"]["template"]["spec"];
    let mut problem = |what: String| problems.push(format!("DaemonSet/{name}: {what}"));

    // Only on GPU nodes, as the GPU operator's feature discovery labels them.
    let terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    let gpu_label = |term: &Value| {
        term["matchExpressions"]
            .as_sequence()
            .into_iter()
            .flatten()
            .any(|e| {
                str_at(e, &["key"]) == Some("nvidia.com/gpu.present")
                    && str_at(e, &["operator"]) == Some("In")
                    && e["values"]
                        .as_sequence()
                        .is_some_and(|v| v.len() == 1 && v[0].as_str() == Some("true"))
            })
    };
    let by_selector = str_at(pod, &["nodeSelector", "nvidia.com/gpu.present"]) == Some("true");
    if !(by_selector || (!terms.is_empty() && terms.iter().all(gpu_label))) {
        problem("not restricted to nodes labelled nvidia.com/gpu.present=true".into());
    }
    if str_at(pod, &["runtimeClassName"]) != Some("nvidia") {
        problem("runtimeClassName is not nvidia".into());
    }

    let container = &pod["containers"][0];
    let env = container["env"].as_sequence().cloned().unwrap_or_default();
    let from_field = |var: &str| {
        env.iter()
            .find(|e| str_at(e, &["name"]) == Some(var))
            .and_then(|e| str_at(e, &["valueFrom", "fieldRef", "fieldPath"]))
    };
    if from_field("LH_NODE_ID") != Some("spec.nodeName") {
        problem("LH_NODE_ID does not come from spec.nodeName".into());
    }
    if env_value(container, "LH_GPU_BACKEND").as_deref() != Some("nvml") {
        problem("LH_GPU_BACKEND is not nvml".into());
    }
    if env_value(container, "LH_SIM_FALLBACK").is_some() {
        problem("a GPU node falls back to a simulated one".into());
    }
    if env_value(container, "LH_ZONE").is_none() {
        problem("no LH_ZONE (the NVML backend needs it)".into());
    }
    if env_value(container, "NVIDIA_VISIBLE_DEVICES").as_deref() != Some("all") {
        problem("NVIDIA_VISIBLE_DEVICES is not all".into());
    }
    let capabilities = env_value(container, "NVIDIA_DRIVER_CAPABILITIES").unwrap_or_default();
    for wanted in ["utility", "compute"] {
        if !capabilities.split(',').any(|c| c == wanted || c == "all") {
            problem(format!("NVIDIA_DRIVER_CAPABILITIES lacks {wanted}"));
        }
    }
    if env_value(container, "NVIDIA_MIG_CONFIG_DEVICES").as_deref() != Some("all") {
        problem("no NVIDIA_MIG_CONFIG_DEVICES=all: MIG instances cannot be created".into());
    }
    let added: Vec<&str> = container["securityContext"]["capabilities"]["add"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !added.contains(&"SYS_ADMIN") {
        problem("no SYS_ADMIN: NVML refuses MIG instance changes".into());
    }
    if pod["hostIPC"].as_bool() != Some(true) {
        problem("not in the host's IPC namespace: MPS clients cannot reach the daemon".into());
    }

    // Host paths: the state directory (at the same path, since dockerd
    // resolves what the agent passes it), the NATS seed.
    let host_path = |mount_path: &str| -> Option<String> {
        let mount = container["volumeMounts"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|m| str_at(m, &["mountPath"]) == Some(mount_path))?;
        let volume = str_at(mount, &["name"])?;
        pod["volumes"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|v| str_at(v, &["name"]) == Some(volume))
            .and_then(|v| str_at(v, &["hostPath", "path"]))
            .map(str::to_string)
    };
    match env_value(container, "LH_NODE_STATE_DIR") {
        Some(dir) if host_path(&dir).as_deref() == Some(dir.as_str()) => {}
        other => problem(format!(
            "the state dir {other:?} is not the host's same directory"
        )),
    }
    let seed = env_value(container, "LH_NATS_NKEY_SEED_FILE").unwrap_or_default();
    let seed_dir = Path::new(&seed)
        .parent()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    if host_path(&seed_dir).is_none() {
        problem(format!("the NATS seed {seed} is not on the host"));
    }
    if env_value(container, "LH_NATS_USER").as_deref() != Some("node-$(LH_NODE_ID)") {
        problem("the NATS user is not the node's own".into());
    }
    if let Some(runtime) = env_value(container, "LH_RUNTIME") {
        if runtime == "docker" && host_path("/var/run/docker.sock").is_none() {
            problem("the docker runtime without the host's docker socket".into());
        }
    }
    problems
}

//! The gateway's workload templates: one row each.

use serde_json::Value;

use super::table::{finish, table, text, NONE};

/// One row per template: its name, image, ports and what it is.
pub(crate) fn templates(list: &Value) -> String {
    let templates: &[Value] = list
        .get("templates")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    if templates.is_empty() {
        return "no templates\n".to_string();
    }
    let mut t = table();
    t.set_header(vec!["NAME", "IMAGE", "PORTS", "DESCRIPTION"]);
    for template in templates {
        let ports: Vec<String> = template
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|p| {
                format!(
                    "{}/{} ({})",
                    text(p, "port"),
                    text(p, "protocol"),
                    text(p, "name")
                )
            })
            .collect();
        t.add_row(vec![
            text(template, "name"),
            text(template, "image"),
            match ports.is_empty() {
                true => NONE.to_string(),
                false => ports.join(", "),
            },
            text(template, "description"),
        ]);
    }
    finish(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::test_rows::row_of;
    use serde_json::json;

    #[test]
    fn a_row_per_template_with_its_ports() {
        let out = templates(&json!({"templates": [
            {"name": "jupyter", "description": "Jupyter", "image": "localhost/leasehold/jupyter",
             "command": ["sh"], "ports": [
                {"name": "notebook", "port": 8888, "protocol": "http", "token_file": "/scratch/t"}
             ]},
            {"name": "batch", "image": "localhost/leasehold/python", "ports": []}
        ]}));
        assert!(out.starts_with("NAME"), "{out}");
        assert_eq!(
            row_of(&out, "jupyter"),
            [
                "jupyter",
                "localhost/leasehold/jupyter",
                "8888/http",
                "(notebook)",
                "Jupyter"
            ]
        );
        assert_eq!(
            row_of(&out, "batch"),
            ["batch", "localhost/leasehold/python", "-", "-"]
        );
        assert_eq!(templates(&json!({"templates": []})), "no templates\n");
    }
}

//! `GET /v1/templates`: the workload templates a lease may name, and how a
//! lease request naming one gets its image and command (see
//! [`crate::templates`]).

use axum::extract::State;
use axum::Json;
use lh_events::WorkloadSpec;
use lh_rpc::http::templates::TemplateList;

use super::{ApiContext, ApiError, Caller};
use crate::templates::Templates;

#[utoipa::path(
    get, path = "/v1/templates",
    responses((status = 200, body = TemplateList), (status = 401, body = super::Problem))
)]
pub async fn list(State(ctx): State<ApiContext>, _caller: Caller) -> Json<TemplateList> {
    Json(TemplateList {
        templates: ctx.templates.all().to_vec(),
    })
}

/// Fills `workload` from template `name`: its image and command, and the
/// name, kept so that a client finds the template's ports again. The
/// request keeps its `env` and `network`; an image or a command of its own
/// would contradict the template, and is refused naming the field.
pub(super) fn fill_workload(
    templates: &Templates,
    name: &str,
    workload: &mut Option<WorkloadSpec>,
) -> Result<(), ApiError> {
    let Some(template) = templates.get(name) else {
        let known = templates.names();
        return Err(ApiError::unprocessable(
            format!(
                "no template {name:?}; this gateway has: {} (GET /v1/templates)",
                known.join(", ")
            ),
            "template",
        ));
    };
    let workload = workload.get_or_insert_with(WorkloadSpec::default);
    if workload.image.is_some() {
        return Err(ApiError::unprocessable(
            format!("template {name:?} names the image; leave workload.image out"),
            "workload.image",
        ));
    }
    if !workload.command.is_empty() {
        return Err(ApiError::unprocessable(
            format!("template {name:?} names the command; leave workload.command out"),
            "workload.command",
        ));
    }
    workload.image = Some(template.image.clone());
    workload.command = template.command.clone();
    workload.template = Some(template.name.clone());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(name: &str, workload: WorkloadSpec) -> (Option<String>, String) {
        let mut workload = Some(workload);
        let e = fill_workload(&Templates::built_in(), name, &mut workload).unwrap_err();
        (e.field, e.detail)
    }

    #[test]
    fn a_template_fills_image_command_and_name_and_keeps_the_rest() {
        let templates = Templates::built_in();
        let mut none = None;
        fill_workload(&templates, "jupyter", &mut none).unwrap();
        let filled = none.unwrap();
        let jupyter = templates.get("jupyter").unwrap();
        assert_eq!(filled.image.as_deref(), Some(jupyter.image.as_str()));
        assert_eq!(filled.command, jupyter.command);
        assert_eq!(filled.template.as_deref(), Some("jupyter"));

        let mut with_env = Some(WorkloadSpec {
            env: [("A".to_string(), "1".to_string())].into(),
            network: lh_events::WorkloadNetwork::Tenant,
            ..Default::default()
        });
        fill_workload(&templates, "jupyter", &mut with_env).unwrap();
        let with_env = with_env.unwrap();
        assert_eq!(with_env.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(with_env.network, lh_events::WorkloadNetwork::Tenant);
    }

    #[test]
    fn an_unknown_template_or_a_second_image_or_command_is_refused_by_its_field() {
        let (field, detail) = refusal("nope", WorkloadSpec::default());
        assert_eq!(field.as_deref(), Some("template"));
        assert!(detail.contains("jupyter"), "{detail}");
        let (field, _) = refusal(
            "jupyter",
            WorkloadSpec {
                image: Some("localhost/x".into()),
                ..Default::default()
            },
        );
        assert_eq!(field.as_deref(), Some("workload.image"));
        let (field, _) = refusal(
            "jupyter",
            WorkloadSpec {
                command: vec!["true".into()],
                ..Default::default()
            },
        );
        assert_eq!(field.as_deref(), Some("workload.command"));
    }
}

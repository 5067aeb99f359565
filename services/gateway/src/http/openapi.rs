//! The OpenAPI document of the REST API, served at `/openapi.json`.

use axum::response::IntoResponse;
use utoipa::OpenApi;

use super::{audit, invoices, keys, leases, nodes, tenants, Problem};

#[derive(OpenApi)]
#[openapi(
    info(title = "Leasehold API", description = "Rent whole GPUs by the second."),
    paths(
        tenants::create,
        tenants::get,
        tenants::suspend,
        tenants::resume,
        tenants::set_quota,
        keys::issue,
        keys::list,
        keys::revoke,
        leases::create,
        leases::list,
        leases::get,
        leases::stop,
        leases::resume,
        nodes::drain,
        nodes::uncordon,
        invoices::show,
        audit::verify
    ),
    components(schemas(
        Problem,
        lh_rpc::invoice::Invoice,
        lh_rpc::invoice::InvoiceLine,
        lh_rpc::audit::VerifyResponse,
        lh_rpc::audit::VerifyAnchor
    )),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        openapi.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
    }
}

pub async fn openapi_json() -> impl IntoResponse {
    axum::Json(ApiDoc::openapi())
}

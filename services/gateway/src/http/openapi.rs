//! The OpenAPI document of the REST API, served at `/openapi.json`.

use axum::response::IntoResponse;
use utoipa::OpenApi;

use super::console_sign_in;
use super::datasets;
use super::events;
use super::fleet;
use super::lease_logs;
use super::lease_sessions;
use super::lease_web;
use super::ssh_keys;
use super::whoami;
use super::workspaces;

use super::{
    audit, balances, billing, invoices, keys, leases, nodes, price_books, quotes, reservations,
    spot, templates, tenants, usage, Problem,
};

#[derive(OpenApi)]
#[openapi(
    info(title = "Leasehold API", description = "Rent whole GPUs by the second."),
    paths(
        tenants::create,
        tenants::list,
        tenants::get,
        tenants::suspend,
        tenants::resume,
        tenants::set_quota,
        tenants::erase,
        keys::issue,
        keys::list,
        keys::revoke,
        ssh_keys::add,
        ssh_keys::list,
        ssh_keys::remove,
        datasets::usage,
        datasets::credentials,
        datasets::add,
        datasets::list,
        datasets::get,
        datasets::manifest,
        datasets::remove,
        workspaces::list,
        workspaces::snapshot,
        workspaces::restore,
        workspaces::remove,
        leases::create,
        leases::list,
        leases::get,
        leases::stop,
        leases::resume,
        lease_logs::get,
        lease_sessions::exec,
        lease_sessions::port_forward,
        fleet::list,
        fleet::get,
        fleet::catalogue,
        events::stream,
        whoami::whoami,
        lease_web::ticket,
        console_sign_in::console,
        console_sign_in::token,
        nodes::enroll,
        nodes::drain,
        nodes::uncordon,
        invoices::list,
        invoices::show,
        spot::prices,
        templates::list,
        invoices::csv,
        invoices::charges,
        invoices::cost_report,
        price_books::publish,
        price_books::list,
        reservations::commit,
        reservations::list,
        balances::top_up,
        balances::get,
        quotes::create,
        billing::what_if,
        audit::verify,
        audit::events,
        usage::fleet,
        usage::lease
    ),
    components(schemas(
        Problem,
        whoami::Whoami,
        lease_web::WebTicketRequest,
        lease_web::WebTicket,
        console_sign_in::ConsoleSignInView,
        console_sign_in::CodeExchange,
        console_sign_in::SignedIn,
        lh_rpc::http::lease_logs::LeaseLogsView,
        lh_rpc::charges::ChargeStatement,
        lh_rpc::charges::ChargeLine,
        lh_rpc::spot::SpotPrices,
        lh_rpc::fleet::FleetView,
        lh_rpc::fleet::NodeView,
        lh_rpc::fleet::NodeState,
        lh_rpc::fleet::GpuView,
        lh_rpc::fleet::ShareView,
        lh_rpc::http::nodes::GpuCatalogue,
        lh_rpc::http::nodes::GpuOffer,
        lh_rpc::http::nodes::TierOffer,
        lh_rpc::spot::SpotMarketView,
        lh_rpc::spot::SpotPricePoint,
        lh_rpc::invoice_document::InvoiceDocument,
        lh_rpc::invoice_document::DocumentList,
        lh_rpc::invoice_document::DocumentSummary,
        lh_rpc::invoice_document::DocumentKind,
        lh_rpc::invoice_document::DocumentStatus,
        lh_rpc::invoice_document::Line,
        lh_rpc::invoice_document::Credit,
        lh_rpc::cost_report::CostReport,
        lh_rpc::cost_report::TierCost,
        lh_rpc::http::price_books::NewPriceBook,
        lh_rpc::price_book::PriceBooks,
        lh_rpc::price_book::Published,
        lh_rpc::http::reservations::NewReservation,
        lh_rpc::reservation::Reservations,
        lh_rpc::http::balances::NewTopUp,
        lh_rpc::http::quotes::NewQuote,
        lh_rpc::http::balances::TopUp,
        lh_rpc::balance::Balance,
        lh_rpc::balance::BalanceState,
        lh_rpc::http::billing::WhatIf,
        lh_rpc::http::billing::WhatIfBook,
        lh_rpc::what_if::WhatIfReport,
        lh_rpc::what_if::TenantDifference,
        lh_rpc::audit::VerifyResponse,
        lh_rpc::audit::VerifyAnchor,
        lh_rpc::audit::VerifyBadCheckpoint,
        lh_rpc::audit::EventsPage,
        lh_rpc::audit::AuditRecord,
        lh_events::trail::Outcome,
        lh_rpc::http::usage::UsageReport,
        lh_rpc::http::usage::UsageSeries,
        lh_rpc::http::usage::UsagePoint
    )),
    modifiers(&BearerAuth, &ProblemResponses)
)]
pub struct ApiDoc;

/// Media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Documents the errors every route can answer besides its own, each as
/// `application/problem+json` with the `Problem` schema, so that a client
/// or a schema-driven fuzzer meets no undocumented status: every route
/// needs a caller (401) and the database and the log (503); every write
/// may be refused to an auditor or a suspended tenant (403), lose a race
/// (409) or exceed the tenant's write budget (429); a body or a query can
/// be unreadable (400) or break a rule (422); an id can name nothing (404).
struct ProblemResponses;

impl ProblemResponses {
    fn statuses(method: &str, operation: &utoipa::openapi::path::Operation) -> Vec<u16> {
        use utoipa::openapi::path::ParameterIn;
        let params = operation.parameters.as_deref().unwrap_or_default();
        let has = |place: fn(&ParameterIn) -> bool| params.iter().any(|p| place(&p.parameter_in));
        let mut statuses = vec![401, 503];
        if method != "get" {
            statuses.extend([403, 409, 429]);
        }
        if operation.request_body.is_some() || has(|p| matches!(p, ParameterIn::Query)) {
            statuses.extend([400, 422]);
        }
        if has(|p| matches!(p, ParameterIn::Path)) {
            statuses.push(404);
        }
        statuses
    }

    fn describe(status: u16) -> &'static str {
        match status {
            400 => "The body or query cannot be read",
            401 => "No caller, or a key or token that is unknown, revoked or expired",
            403 => "The caller's role does not allow this, or its tenant is suspended",
            404 => "No such object, or one the caller may not see",
            409 => "The object's state or a concurrent change refuses this; retry or reread",
            422 => "A field breaks a rule; `field` names it",
            429 => "Over the tenant's budget; see Retry-After",
            503 => "The database or the log is out of reach; see Retry-After",
            _ => "Error",
        }
    }
}

impl utoipa::Modify for ProblemResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
        let problem = || {
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build()
        };
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                ("get", &mut item.get),
                ("put", &mut item.put),
                ("post", &mut item.post),
                ("delete", &mut item.delete),
                ("patch", &mut item.patch),
            ];
            for (method, operation) in operations {
                let Some(operation) = operation else {
                    continue;
                };
                for status in Self::statuses(method, operation) {
                    operation
                        .responses
                        .responses
                        .entry(status.to_string())
                        .or_insert_with(|| {
                            RefOr::T(
                                ResponseBuilder::new()
                                    .description(Self::describe(status))
                                    .build(),
                            )
                        });
                }
                for (status, response) in operation.responses.responses.iter_mut() {
                    let is_error = status.parse::<u16>().is_ok_and(|s| s >= 400);
                    if let (true, RefOr::T(response)) = (is_error, response) {
                        if response.description.is_empty() {
                            response.description =
                                Self::describe(status.parse().unwrap_or(0)).to_string();
                        }
                        response.content.clear();
                        response.content.insert(PROBLEM_JSON.to_string(), problem());
                    }
                }
            }
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invoice_documents_lines_and_parts_are_described() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let schemas = &doc["components"]["schemas"];
        // The events' line type, under the name the document has always
        // used, its amount a string as it is sent.
        let line = &schemas["Line"]["properties"];
        assert_eq!(line["amount"]["type"], "string", "{line}");
        assert_eq!(line["lease_id"]["format"], "uuid", "{line}");
        let document = &schemas["InvoiceDocument"]["properties"];
        assert_eq!(
            document["lines"]["items"]["$ref"],
            "#/components/schemas/Line"
        );
        for field in ["part", "parts", "first_part_id"] {
            assert!(document[field].is_object(), "no {field}: {document}");
            assert!(schemas["DocumentSummary"]["properties"][field].is_object());
        }
    }

    #[test]
    fn the_audit_records_route_names_its_filters_as_sent() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let params = doc["paths"]["/v1/audit/events"]["get"]["parameters"]
            .as_array()
            .expect("the route has parameters");
        let names: Vec<&str> = params.iter().filter_map(|p| p["name"].as_str()).collect();
        assert_eq!(
            names,
            ["tenant_id", "actor", "type", "from", "to", "after", "limit"]
        );
        let record = &doc["components"]["schemas"]["AuditRecord"]["properties"];
        for field in [
            "sequence",
            "occurred_at",
            "actor",
            "event_type",
            "object",
            "outcome",
        ] {
            assert!(record[field].is_object(), "no {field}: {record}");
        }
    }
}

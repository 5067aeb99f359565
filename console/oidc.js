// Signing in with the platform's OpenID Connect issuer, where the gateway
// offers it (`GET /v1/oidc/console`): the authorization code flow with
// PKCE. The browser goes to the issuer; back here with a code, the page
// asks the gateway to trade it (`POST /v1/oidc/token`), since the page may
// call no other origin, and keeps the token it gets like a key.

const PENDING = "leasehold.oidc";
/// Random bytes in the PKCE verifier (43 characters as base64url).
const VERIFIER_BYTES = 32;
const STATE_BYTES = 16;

function base64url(bytes) {
  let binary = "";
  for (const b of new Uint8Array(bytes)) binary += String.fromCharCode(b);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

const random = (n) => base64url(crypto.getRandomValues(new Uint8Array(n)));

/// Where the console comes back to: its own page, no query.
export const redirectUri = () => `${location.origin}/console/`;

/// The issuer the gateway offers, or null.
export async function offered() {
  try {
    const answer = await fetch("/v1/oidc/console");
    return answer.ok ? await answer.json() : null;
  } catch (_) {
    return null;
  }
}

/// Sends the browser to the issuer.
export async function start(issuer) {
  const verifier = random(VERIFIER_BYTES);
  const state = random(STATE_BYTES);
  sessionStorage.setItem(PENDING, JSON.stringify({ verifier, state }));
  const challenge = base64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
  const query = new URLSearchParams({
    response_type: "code",
    client_id: issuer.client_id,
    redirect_uri: redirectUri(),
    scope: issuer.scope,
    state,
    code_challenge: challenge,
    code_challenge_method: "S256",
  });
  const sep = issuer.authorization_endpoint.includes("?") ? "&" : "?";
  location.assign(issuer.authorization_endpoint + sep + query);
}

/// Whether this page is the issuer sending the browser back.
export function returning() {
  const query = new URLSearchParams(location.search);
  return query.has("code") || query.has("error");
}

/// Finishes a sign-in the issuer sent back: `{token, role}`, or throws
/// what went wrong. The code leaves the address bar either way.
export async function finish() {
  const query = new URLSearchParams(location.search);
  history.replaceState(null, "", location.pathname + "#/gpus");
  const pending = JSON.parse(sessionStorage.getItem(PENDING) || "null");
  sessionStorage.removeItem(PENDING);
  // An answer this tab did not ask for is not taken, nor shown: it may be
  // another's, or another site's words.
  if (!pending || query.get("state") !== pending.state) throw new Error("state");
  if (query.has("error")) throw new Error(query.get("error_description") || query.get("error"));
  const answer = await fetch("/v1/oidc/token", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ code: query.get("code"), code_verifier: pending.verifier, redirect_uri: redirectUri() }),
  });
  const body = await answer.json().catch(() => ({}));
  if (!answer.ok) throw new Error(body.detail || String(answer.status));
  return body;
}

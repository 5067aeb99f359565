// The console's calls to the gateway on its own origin: the key goes in
// an Authorization header (never a cookie, so no request can be forged
// from another site), kept in this tab's sessionStorage only.

const KEY = "leasehold.key";

export const key = () => sessionStorage.getItem(KEY);
export const remember = (k) => sessionStorage.setItem(KEY, k);
export const forget = () => sessionStorage.removeItem(KEY);

/// Said on `window` when the key held stops being taken (revoked, or an
/// issuer's token past its time): the console then asks to sign in again.
export const REFUSED = "leasehold-key-refused";

function heard(response, withKey) {
  if (response.status === 401 && withKey && withKey === key()) dispatchEvent(new Event(REFUSED));
  return response;
}

/// GETs `path`: `{status, body}`, body the JSON answer (or null).
export async function get(path, withKey = key()) {
  const response = heard(await fetch(path, { headers: { Authorization: `Bearer ${withKey}` } }), withKey);
  let body = null;
  try { body = await response.json(); } catch (_) { /* not JSON */ }
  return { status: response.status, body };
}

/// Sends `method` to `path` with `body` (JSON, or nothing): `{status,
/// body}`, body the JSON answer (or null, as for a 204).
export async function send(method, path, body) {
  const headers = { Authorization: `Bearer ${key()}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = heard(await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  }), key());
  let answer = null;
  try { answer = await response.json(); } catch (_) { /* not JSON */ }
  return { status: response.status, body: answer };
}

/// POSTs `body` (JSON, or nothing) to `path`.
export const post = (path, body) => send("POST", path, body);

/// GETs `path` as the gateway wrote it: `{status, text}`, for what must be
/// kept byte for byte (JSON parsed and written again turns 50.0 into 50).
export async function getText(path) {
  const response = await fetch(path, { headers: { Authorization: `Bearer ${key()}` } });
  return { status: response.status, text: await response.text() };
}

/// DELETEs `path`.
export const del = (path) => send("DELETE", path);

/// Saves `blob`, made here, as a file named `name`: an object URL clicked
/// as a link, since the browser alone may write the user's disk.
export function saveBlob(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

/// Downloads `path` (which needs the key, so no plain link can fetch it)
/// as a file named `name`.
export async function download(path, name) {
  const response = await fetch(path, { headers: { Authorization: `Bearer ${key()}` } });
  if (!response.ok) throw new Error(String(response.status));
  saveBlob(await response.blob(), name);
}

/// Calls `onChange` with each change the gateway's event stream tells
/// (`GET /v1/events/stream`), reconnecting when it ends, until `stop()`.
/// A fetch stream, not an EventSource: that cannot send the key. Opened
/// again, it names the last change it heard (`Last-Event-ID`), so that
/// what came meanwhile is told too.
///
/// A browser holds six connections to an origin at most, and a stream
/// holds one: a tab that is hidden lets go of its stream (after
/// `HIDDEN_GRACE_MS`) and a page that is left lets go at once, so that
/// tabs and pages opened one after another never starve each other. A
/// tab shown again opens it again from the last change it heard, and
/// tells `onChange` once, for what it may have missed.
const HIDDEN_GRACE_MS = 5000;

export function follow(onChange) {
  let stopped = false;
  let paused = false;
  let controller = null;
  let lastHeard = null;
  let hiding = null;
  let running = false;
  const pause = () => {
    paused = true;
    if (controller) controller.abort();
  };
  const onVisibility = () => {
    clearTimeout(hiding);
    if (document.visibilityState === "hidden") {
      hiding = setTimeout(pause, HIDDEN_GRACE_MS);
    } else if (paused) {
      paused = false;
      onChange("resumed", {});
      if (!running) run();
    }
  };
  addEventListener("visibilitychange", onVisibility);
  addEventListener("pagehide", pause);
  // A page kept whole while away (the back-forward cache) comes back shown.
  addEventListener("pageshow", onVisibility);
  const run = async () => {
    running = true;
    while (!stopped && !paused) {
      controller = new AbortController();
      try {
        const headers = { Authorization: `Bearer ${key()}` };
        if (lastHeard) headers["Last-Event-ID"] = lastHeard;
        const response = await fetch("/v1/events/stream", { headers, signal: controller.signal });
        if (!response.ok) throw new Error(String(response.status));
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        let text = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          text += decoder.decode(value, { stream: true });
          let end;
          while ((end = text.indexOf("\n\n")) >= 0) {
            const block = text.slice(0, end);
            text = text.slice(end + 2);
            const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("");
            const event = (block.split("\n").find((l) => l.startsWith("event:")) || "").slice(6).trim();
            const id = (block.split("\n").find((l) => l.startsWith("id:")) || "").slice(3).trim();
            if (id) lastHeard = id;
            if (event && event !== "open" && data) {
              try { onChange(event, JSON.parse(data)); } catch (_) { /* a change unread is read at the next */ }
            }
          }
        }
      } catch (_) {
        if (stopped || paused) break;
      }
      await new Promise((r) => setTimeout(r, 2000));
    }
    running = false;
  };
  run();
  return () => {
    stopped = true;
    clearTimeout(hiding);
    removeEventListener("visibilitychange", onVisibility);
    removeEventListener("pagehide", pause);
    removeEventListener("pageshow", onVisibility);
    if (controller) controller.abort();
  };
}

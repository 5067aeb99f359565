// A shell in a running lease, in the page: xterm.js over the exec
// WebSocket (subprotocol v5.channel.k8s.io: one message is one frame, its
// first byte the channel). A browser cannot set a header on a WebSocket,
// so the key rides in a second subprotocol, as Kubernetes' API server
// takes it; the gateway answers with the exec one only.

import * as api from "./api.js";

const EXEC = "v5.channel.k8s.io";
const BEARER = "base64url.bearer.authorization.k8s.io.";
const STDIN = 0;
const STDOUT = 1;
const STDERR = 2;
const STATUS = 3;
const RESIZE = 4;
/// Most bytes of input in one message: the gateway's limit is 64 KiB
/// after the channel byte.
const MAX_INPUT_BYTES = 64 * 1024;

/// What the shell runs: a login bash where the image has one, else the
/// POSIX shell every image has (as `lh lease shell`).
const SHELL = ["sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"];

/// xterm makes its own `<style>` elements; the page's policy lets in only
/// those with the nonce the gateway gave this page, so each style element
/// made from here on carries it (set before it is inserted, or the
/// browser drops its rules).
let stamped = false;
function stampStyleNonce() {
  if (stamped) return;
  stamped = true;
  const nonce = (document.querySelector("link[nonce]") || {}).nonce;
  if (!nonce) return;
  const create = Document.prototype.createElement;
  Document.prototype.createElement = function createElement(name, options) {
    const element = create.call(this, name, options);
    if (String(name).toLowerCase() === "style") element.setAttribute("nonce", nonce);
    return element;
  };
}

function base64url(text) {
  const bytes = new TextEncoder().encode(text);
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function frame(channel, bytes) {
  const message = new Uint8Array(bytes.length + 1);
  message[0] = channel;
  message.set(bytes, 1);
  return message;
}

/// How a session ended, from its status frame (a Kubernetes Status).
function endOf(status) {
  if (status.status === "Success") return { code: 0 };
  const cause = ((status.details || {}).causes || []).find((c) => c.reason === "ExitCode");
  return cause ? { code: Number(cause.message) } : { error: status.message || status.reason || "failed" };
}

/// Opens a shell in lease `id` on a terminal in `element`. `onEnd` hears
/// `{code}` or `{error}` once. Resolves to a function that closes it. The
/// terminal's code (a third of a megabyte) is fetched only now, so that no
/// other page waits for it.
export async function openShell(element, id, onEnd, node) {
  stampStyleNonce();
  const [{ Terminal }, { FitAddon }] = await Promise.all([
    import("./vendor/xterm.mjs"),
    import("./vendor/addon-fit.mjs"),
  ]);
  const terminal = new Terminal({ cursorBlink: true, fontSize: 14, convertEol: false, scrollback: 5000 });
  const fit = new FitAddon();
  terminal.loadAddon(fit);
  terminal.open(element);
  fit.fit();
  const query = new URLSearchParams();
  for (const word of SHELL) query.append("command", word);
  query.set("stdin", "true");
  query.set("tty", "true");
  query.set("cols", String(terminal.cols));
  query.set("rows", String(terminal.rows));
  // A lease across nodes: the member to enter (the first without one).
  if (node) query.set("node", node);
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const url = `${scheme}://${location.host}/v1/leases/${encodeURIComponent(id)}/exec?${query}`;
  const socket = new WebSocket(url, [EXEC, BEARER + base64url(api.key())]);
  socket.binaryType = "arraybuffer";
  let ended = false;
  let opened = false;
  const end = (how) => {
    if (ended) return;
    ended = true;
    onEnd(how);
  };
  const encoder = new TextEncoder();
  const decoder = new TextDecoder();
  const send = (channel, bytes) => {
    if (socket.readyState !== WebSocket.OPEN) return;
    let at = 0;
    do {
      socket.send(frame(channel, bytes.subarray(at, at + MAX_INPUT_BYTES)));
      at += MAX_INPUT_BYTES;
    } while (at < bytes.length);
  };
  const typed = terminal.onData((data) => send(STDIN, encoder.encode(data)));
  const binary = terminal.onBinary((data) => send(STDIN, Uint8Array.from(data, (c) => c.charCodeAt(0) & 255)));
  const resized = terminal.onResize(({ cols, rows }) => send(RESIZE, encoder.encode(JSON.stringify({ Width: cols, Height: rows }))));
  const onWindow = () => fit.fit();
  addEventListener("resize", onWindow);
  socket.onopen = () => { opened = true; terminal.focus(); };
  socket.onmessage = (event) => {
    const bytes = new Uint8Array(event.data);
    if (bytes.length === 0) return;
    const body = bytes.subarray(1);
    if (bytes[0] === STDOUT || bytes[0] === STDERR) terminal.write(body);
    else if (bytes[0] === STATUS) {
      try { end(endOf(JSON.parse(decoder.decode(body)))); } catch (_) { end({ error: "an unreadable status" }); }
    }
  };
  socket.onclose = (event) => {
    if (!opened) end({ error: "refused" });
    else end(event.code === 1000 ? { code: null } : { error: event.reason || `closed (${event.code})` });
  };
  return () => {
    removeEventListener("resize", onWindow);
    typed.dispose();
    binary.dispose();
    resized.dispose();
    if (socket.readyState <= WebSocket.OPEN) socket.close(1000);
    terminal.dispose();
  };
}

/// Runs `command` in lease `id` without a terminal: resolves to its
/// standard output and exit code (as `lh lease exec` does).
export function run(id, command) {
  return new Promise((resolve, reject) => {
    const query = new URLSearchParams();
    for (const word of command) query.append("command", word);
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const url = `${scheme}://${location.host}/v1/leases/${encodeURIComponent(id)}/exec?${query}`;
    const socket = new WebSocket(url, [EXEC, BEARER + base64url(api.key())]);
    socket.binaryType = "arraybuffer";
    const decoder = new TextDecoder();
    let stdout = "";
    let ended = null;
    socket.onmessage = (event) => {
      const bytes = new Uint8Array(event.data);
      if (bytes[0] === STDOUT) stdout += decoder.decode(bytes.subarray(1), { stream: true });
      else if (bytes[0] === STATUS) {
        try { ended = endOf(JSON.parse(decoder.decode(bytes.subarray(1)))); } catch (_) { ended = { error: "an unreadable status" }; }
      }
    };
    socket.onclose = () => {
      if (ended && ended.code != null) resolve({ stdout, code: ended.code });
      else reject(new Error((ended && ended.error) || "refused"));
    };
  });
}

// What every page of the console shares: templates, answers that follow
// the event stream, a failure shown where it happened.

import { h } from "./vendor/preact.mjs";
import { useEffect, useRef, useState } from "./vendor/hooks.mjs";
import htm from "./vendor/htm.mjs";
import * as api from "./api.js";
import { t } from "./i18n.js";

export const html = htm.bind(h);

/// GETs `path` now and again whenever `tick` says a change came. One
/// call at a time per path: changes that come while one is out are read
/// by one more call after it, so that a flood of changes neither floods
/// the gateway nor keeps the page from ever showing an answer.
export function useAnswer(path, tick) {
  const [answer, setAnswer] = useState(null);
  const reader = useRef(null);
  const seen = useRef(tick);
  useEffect(() => {
    const mine = { alive: true, out: false, again: false };
    const read = () => {
      mine.out = true;
      mine.again = false;
      api.get(path).catch(() => ({ status: 0, body: null })).then((a) => {
        mine.out = false;
        if (!mine.alive) return;
        setAnswer(a);
        if (mine.again) read();
      });
    };
    mine.poke = () => { if (mine.out) mine.again = true; else read(); };
    reader.current = mine;
    setAnswer(null);
    read();
    return () => { mine.alive = false; };
  }, [path]);
  useEffect(() => {
    if (seen.current === tick) return;
    seen.current = tick;
    if (reader.current) reader.current.poke();
  }, [tick]);
  return answer;
}

/// What a refusal says, with the field at fault where the API names one.
export function refusal(answer) {
  const body = answer.body || {};
  if (!body.detail) return answer.status ? String(answer.status) : t("unreachable");
  return body.field ? `${body.detail} (${body.field})` : body.detail;
}

export function Failed({ answer }) {
  return html`<p class="error" role="alert">${(answer.body && answer.body.detail) || t("unreachable")}</p>`;
}

/// A counter that goes up every `ms`: for what changes without an event
/// (GPU readings).
export function useEvery(ms) {
  const [n, setN] = useState(0);
  useEffect(() => {
    const timer = setInterval(() => setN((x) => x + 1), ms);
    return () => clearInterval(timer);
  }, [ms]);
  return n;
}

export function Loading() {
  return html`<p class="loading">${t("loading")}</p>`;
}

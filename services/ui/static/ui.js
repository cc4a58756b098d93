// rollout ui: live updates over server-sent events (no polling), and lazily read fragments.
"use strict";

function applyFragments(html) {
  for (const [id, markup] of Object.entries(html)) {
    const node = document.getElementById(id);
    if (node) node.innerHTML = markup;
  }
}

function followLive() {
  const topic = document.body.dataset.liveTopic;
  if (!topic || !window.EventSource) return;
  // The page's own filters and page number travel along, so a re-read list matches the page.
  const params = new URLSearchParams(window.location.search);
  params.set("topic", topic);
  if (document.body.dataset.livePage) params.set("page", document.body.dataset.livePage);
  const source = new EventSource("/live?" + params.toString());
  source.addEventListener("ready", () => { document.body.dataset.live = "on"; });
  source.addEventListener("update", (event) => {
    const data = JSON.parse(event.data);
    applyFragments(data.html);
    document.body.dataset.liveSeq = String(data.seq);
  });
  source.addEventListener("error", () => { document.body.dataset.live = "reconnecting"; });
}

async function loadFragments() {
  for (const node of document.querySelectorAll("[data-fragment]")) {
    const response = await fetch(node.dataset.fragment, { credentials: "same-origin" });
    node.innerHTML = response.ok ? await response.text() : "<dt>error</dt><dd>" + response.status + "</dd>";
    node.dataset.loaded = "yes";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  followLive();
  loadFragments();
});

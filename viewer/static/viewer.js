// harnessrl trace viewer: expand/collapse, token details on hover, live refresh.
// No content is ever inserted as HTML except whole pages from this server (already escaped).
"use strict";

function expandAll(open) {
  document.querySelectorAll("details").forEach(function (d) { d.open = open; });
}

function tokenInfo(event) {
  var box = document.getElementById("tokinfo");
  var tok = event.target.closest ? event.target.closest(".tok") : null;
  if (!box) return;
  if (!tok || !tok.closest(".tokens")) { box.hidden = true; return; }
  var cls = "";
  tok.classList.forEach(function (c) { if (c.indexOf("c-") === 0) cls = c.slice(2); });
  var parts = [JSON.stringify(tok.textContent), cls];
  var lp = tok.getAttribute("data-lp");
  if (lp !== null) parts.push("log-prob " + lp + " · p " + Math.exp(parseFloat(lp)).toFixed(3));
  var adv = tok.getAttribute("data-adv");
  if (adv !== null) {
    parts.push(tok.classList.contains("adv-off") ? "not trained (loss mask 0)" : "trained");
    parts.push("advantage " + adv);
  }
  box.textContent = parts.join(" · ");
  box.hidden = false;
}

// live: re-fetch this page every few seconds and swap the main content (what a reload shows)
var LIVE_KEY = "harnessrl-live";
var timer = null;

// A <details> by its id, else by the nearest id above it and its position there: the same key
// in the page and in a fresh copy of it.
function detailsKey(d) {
  if (d.id) return d.id;
  var owner = d.parentElement.closest("[id]");
  return owner.id + "/" + Array.prototype.indexOf.call(owner.querySelectorAll("details"), d);
}

// What the reader opened or closed survives a refresh (a long session's calls start folded).
function keepOpenState(old, fresh) {
  var state = {};
  old.querySelectorAll("details").forEach(function (d) { state[detailsKey(d)] = d.open; });
  fresh.querySelectorAll("details").forEach(function (d) {
    var key = detailsKey(d);
    if (Object.prototype.hasOwnProperty.call(state, key)) d.open = state[key];
  });
}

function refresh() {
  fetch(window.location.href, { headers: { "Accept": "text/html" }, cache: "no-store" })
    .then(function (r) { return r.ok ? r.text() : null; })
    .then(function (html) {
      if (html === null) return;
      var doc = new DOMParser().parseFromString(html, "text/html");
      var fresh = doc.getElementById("content");
      var old = document.getElementById("content");
      if (fresh && old) {
        keepOpenState(old, fresh);
        old.replaceWith(document.adoptNode(fresh));
      }
    })
    .catch(function () { /* the server is restarting: try again next tick */ });
}

function setLive(on) {
  if (timer) { clearInterval(timer); timer = null; }
  if (on) timer = setInterval(refresh, 3000);
  try { sessionStorage.setItem(LIVE_KEY, on ? "1" : "0"); } catch (e) { /* storage off */ }
}

document.addEventListener("DOMContentLoaded", function () {
  document.documentElement.setAttribute("data-js", "on");  // shows the controls that need this script
  document.addEventListener("click", function (e) {
    var b = e.target.closest ? e.target.closest("button[data-expand]") : null;
    if (b) expandAll(b.getAttribute("data-expand") === "open");
  });
  document.addEventListener("mouseover", tokenInfo);
  var live = document.getElementById("live");
  if (live) {
    var stored = null;
    try { stored = sessionStorage.getItem(LIVE_KEY); } catch (e) { /* storage off */ }
    live.checked = stored === "1" || new URLSearchParams(window.location.search).get("live") === "1";
    setLive(live.checked);
    live.addEventListener("change", function () { setLive(live.checked); });
  }
});

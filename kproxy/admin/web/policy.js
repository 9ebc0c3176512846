// The live page's policy panel: the rules file's violators, each with its first request.
// Shown only when kproxy runs with a policy_file; uses app.js's call(), $ and fillTable().
"use strict";

const POLICY_EVERY_MS = 5000;

async function refreshPolicy() {
  if (started && !refused) {       // app.js: nothing is fetched before there is a token
    try {
      const p = await (await call("/live/policy")).json();
      $("#policy-panel").hidden = !p.configured;
      if (p.configured) {
        const enforced = p.rules.filter((r) => r.enforce).map((r) => `${r.name} (${r.refused} refused)`);
        $("#policy-note").textContent = `${p.rules.length} rules from ${p.file}` +
          (enforced.length ? ` · enforced: ${enforced.join(", ")}` : " · dry run");
        const rows = p.violators.length ? p.violators : [{rule: "no violations so far"}];
        fillTable($("#policy tbody"), rows, (v) => v.example ? [
          [v.rule], [v.client_id || "(none)"], [v.client_software || "unknown"], [v.count, "num"],
          [new Date(v.first_time * 1000).toISOString().replace("T", " ").slice(0, 19)],
          [`${v.example.api} v${v.example.api_version} from ${v.example.client_address}: ${v.example.reason}`, "wrap"],
          [v.enforced ? "refused" : "dry run"]] : [[v.rule]]);
      }
    } catch (e) { /* refused or down: the state pill says so */ }
  }
  setTimeout(refreshPolicy, POLICY_EVERY_MS);
}

window.addEventListener("DOMContentLoaded", refreshPolicy);

// Live updates without a reload: poll the page's JSON endpoint and swap in the
// server-rendered fragments it returns. Other scripts (charts) listen for the
// "regatta:live" event to use the rest of the payload.
(function () {
  const root = document.querySelector("[data-live-url]");
  if (!root) return;
  const every = Number(root.dataset.liveEvery || 2500);
  const seen = {};
  const stamp = document.getElementById("live-at");

  // A page whose answers carry a revision (the job page) sends back the last
  // one: the server then renders only what changed since.
  let since = "";

  function url() {
    const extra = [root.dataset.liveParams || "", since].filter(Boolean).join("&");
    const base = root.dataset.liveUrl;
    return extra ? base + (base.includes("?") ? "&" : "?") + extra : base;
  }

  function apply(data) {
    for (const [id, html] of Object.entries(data.fragments || {})) {
      const el = document.getElementById(id);
      // Swapping identical markup would still reset hover and focus; skip it.
      if (el && seen[id] !== html) {
        el.innerHTML = html;
        seen[id] = html;
      }
    }
    if (data.rev) {
      since = "rev=" + encodeURIComponent(data.rev);
    }
    document.dispatchEvent(new CustomEvent("regatta:live", { detail: data }));
  }

  async function tick() {
    try {
      const resp = await fetch(url(), {
        headers: { Accept: "application/json" },
        credentials: "same-origin",
      });
      if (resp.ok) {
        apply(await resp.json());
        if (stamp) {
          stamp.textContent = "live · " + new Date().toLocaleTimeString();
          stamp.classList.remove("stale");
        }
      } else if (stamp) {
        stamp.textContent = "update failed (" + resp.status + ")";
        stamp.classList.add("stale");
      }
    } catch (err) {
      if (stamp) {
        stamp.textContent = "offline";
        stamp.classList.add("stale");
      }
    }
    setTimeout(tick, every);
  }

  // Pages whose heavy parts (chart series) are not in the HTML ask at once,
  // but only after every page script has run and can hear "regatta:live".
  document.addEventListener("DOMContentLoaded", function () {
    setTimeout(tick, root.dataset.liveImmediate ? 0 : every);
  });
})();

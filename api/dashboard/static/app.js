// memmill dashboard: live sections over server-sent events; nothing else needs script.
// A section marked data-live="NAME" is replaced by each "NAME" event's HTML, which the
// server rendered once for every open tab. The stream closes while the tab is hidden.
(function () {
  "use strict";
  const sections = document.querySelectorAll("[data-live]");
  const status = document.querySelector("[data-live-status]");
  const picker = document.querySelector("[data-live-interval]");
  if (!sections.length) return;
  const stored = window.localStorage.getItem("memmill.interval");
  if (picker && stored) picker.value = stored;
  let source = null;

  function say(text, on) {
    if (!status) return;
    status.querySelector("span").textContent = text;
    status.classList.toggle("off", !on);
  }

  function open() {
    close();
    const seconds = picker ? picker.value : "2";
    if (seconds === "0") { say("paused", false); return; }
    const url = new URL(document.body.dataset.stream, window.location.href);
    url.searchParams.set("interval", seconds);
    source = new EventSource(url);
    sections.forEach(function (section) {
      source.addEventListener(section.dataset.live, function (event) {
        section.innerHTML = event.data;
        say("live · updated " + new Date().toLocaleTimeString(), true);
      });
    });
    source.onerror = function () { say("reconnecting…", false); };
  }

  function close() {
    if (source) { source.close(); source = null; }
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) { close(); say("paused while hidden", false); } else { open(); }
  });
  if (picker) {
    picker.addEventListener("change", function () {
      window.localStorage.setItem("memmill.interval", picker.value);
      open();
    });
  }
  open();
})();

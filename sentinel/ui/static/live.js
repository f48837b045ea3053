// The dashboard's live updates: one EventSource per page, closed while the page is hidden
// or held in the back/forward cache (a browser gives a host six connections: six pages
// holding streams would block the seventh load) and opened again when it is shown. On a
// change this page shows, the page asks the server for its new <main> (read from the
// server's cache, never from ZooKeeper) and puts it in place.
(function () {
  "use strict";
  var body = document.body;
  var scope = body.dataset.liveScope; // "all", a service's name, or "none"
  var source = null;
  var pending = false;  // a read of the page's new content is due or under way
  var fetching = false;  // ... under way
  var again = false;  // a change was heard while it was under way

  function setState(state) {
    body.dataset.liveState = state;
    var shown = document.getElementById("live-state");
    if (shown) { shown.textContent = state; }
  }

  function stamp() {
    var meta = document.getElementById("meta");
    if (!meta) { return; }
    body.dataset.version = meta.dataset.version;
    document.getElementById("version").textContent = meta.dataset.version;
    var updated = document.getElementById("updated");
    updated.textContent = meta.dataset.updated;
    updated.setAttribute("datetime", meta.dataset.updated);
    document.getElementById("connection").textContent = meta.dataset.connection;
  }

  function refresh() {
    if (pending) {
      // A change heard while a read is under way may be newer than what that read returns:
      // read once more after it (one more, however many such changes).
      if (fetching) { again = true; }
      return;
    }
    pending = true;
    // Changes that come together are shown together: one read per burst (a quarter second).
    window.setTimeout(function () {
      fetching = true;
      fetch(window.location.href, {
        headers: { "X-Sentinel-Fragment": "main" },
        credentials: "same-origin",
        cache: "no-store"
      }).then(function (response) {
        return response.ok ? response.text() : null;
      }).then(function (html) {
        if (html !== null) {
          document.getElementById("main").innerHTML = html;
          stamp();
        }
        read();
      }, read);
    }, 250);
  }

  function read() {
    pending = false;
    fetching = false;
    if (again) {
      again = false;
      refresh();
    }
  }

  function shows(change) {
    if (scope === "none") { return false; }
    // (metrics too: a collector's health metric is an instance's health)
    if (scope === "all") { return true; }
    return change.service === null || change.service === scope;
  }

  function open() {
    if (source !== null) { return; }
    setState("connecting");
    source = new EventSource("/events");
    source.onopen = function () { setState("open"); };
    source.onerror = function () {
      // CONNECTING: the browser retries by itself; CLOSED: refused (the cap), try later.
      if (source !== null && source.readyState === EventSource.CLOSED) {
        source = null;
        setState("closed");
        window.setTimeout(function () { if (!document.hidden) { open(); } }, 5000);
      } else {
        setState("connecting");
      }
    };
    source.addEventListener("hello", function (event) {
      // Something changed between the page's rendering and its stream: read it again.
      if (event.data !== body.dataset.version && scope !== "none") { refresh(); }
    });
    source.addEventListener("change", function (event) {
      if (shows(JSON.parse(event.data))) { refresh(); }
    });
  }

  function close() {
    if (source !== null) {
      source.close();
      source = null;
    }
    setState("closed");
  }

  window.addEventListener("pagehide", close);
  window.addEventListener("pageshow", function () { if (!document.hidden) { open(); } });
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) { close(); } else { open(); }
  });
  if (!document.hidden) { open(); }
}());

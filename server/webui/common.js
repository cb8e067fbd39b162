// Shared by the chat page and the dashboard: the API key kept in local storage, the dialog that asks
// for it when the server answers 401, and the "about" line naming the embedded libraries.
'use strict';

const strata = (() => {
  const keyName = 'strata.apiKey';

  function apiKey() { return localStorage.getItem(keyName) || ''; }

  function headers(extra) {
    const h = Object.assign({}, extra || {});
    const key = apiKey();
    if (key) h['Authorization'] = 'Bearer ' + key;
    return h;
  }

  // Shows the key dialog; resolves true once a key was saved, false when cancelled. Callers waiting at
  // the same time share one dialog; after a cancel, only a new page load asks again.
  let pending = null;
  let declined = false;
  function askKey(message) {
    if (declined) return Promise.resolve(false);
    if (pending) return pending;
    const dialog = document.getElementById('key-dialog');
    const input = dialog.querySelector('input');
    dialog.querySelector('.key-message').textContent = message || 'This server needs an API key.';
    input.value = apiKey();
    pending = new Promise((resolve) => {
      dialog.onclose = () => {
        pending = null;
        if (dialog.returnValue === 'save' && input.value.trim()) {
          localStorage.setItem(keyName, input.value.trim());
          resolve(true);
        } else {
          declined = true;
          resolve(false);
        }
      };
      dialog.returnValue = '';
      dialog.showModal();
      input.focus();
    });
    return pending;
  }

  // fetch() with the key; a 401 asks for a key and tries once more with it.
  async function call(url, init) {
    const options = Object.assign({}, init || {});
    for (let attempt = 0; ; ++attempt) {
      options.headers = headers(init && init.headers);
      const res = await fetch(url, options);
      if (res.status !== 401 || attempt > 0) return res;
      let message = 'The server answered 401: it needs an API key.';
      try { message = (await res.json()).error.message + '.'; } catch (e) { /* keep the default */ }
      if (!(await askKey(message))) return res;
    }
  }

  async function errorText(res) {
    try {
      const body = await res.json();
      if (body && body.error && body.error.message) return `HTTP ${res.status}: ${body.error.message}`;
    } catch (e) { /* not JSON */ }
    return `HTTP ${res.status} ${res.statusText}`;
  }

  function fillAbout() {
    const about = document.getElementById('about');
    if (!about || typeof STRATA_ABOUT === 'undefined') return;
    const libs = STRATA_ABOUT.libraries.map((l) => `${l.name} ${l.version}`).join(', ');
    about.textContent = `strata ${STRATA_ABOUT.strata} · ${libs} (Debian packages, embedded in the server)`;
  }

  function formatBytes(n) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; ++i; }
    return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
  }

  document.addEventListener('DOMContentLoaded', fillAbout);
  return { apiKey, headers, askKey, call, errorText, formatBytes };
})();

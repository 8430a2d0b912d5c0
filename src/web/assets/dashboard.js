// redwheel dashboard: live refresh and actions. Served from the binary;
// no other script runs on these pages (Content-Security-Policy).
//
// Live refresh: every data-refresh-ms the page fetches itself again and
// swaps in the new <main id="live"> (the server renders and escapes it);
// it waits while a confirmation is open or an action runs. Each swap bumps
// body[data-generation], which tests watch.
// Actions: forms with data-action are sent with fetch() as POSTs with the
// token (Authorization: Bearer), asked for once and kept in the tab's
// session storage.
(function () {
  'use strict';
  var body = document.body;
  var refreshMs = Number(body.getAttribute('data-refresh-ms')) || 2000;
  var tokenRequired = body.getAttribute('data-token-required') === '1';
  var TOKEN_KEY = 'redwheel-dashboard-token';
  var busy = false;
  var generation = 0;
  var timer = null;
  var pending = null;
  // A pointer pressed on the page: no swap until it is released, so that a
  // click is not lost to a refresh.
  var pressed = false;

  function token() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch (e) { return ''; }
  }

  function setToken(t) {
    try {
      if (t) { sessionStorage.setItem(TOKEN_KEY, t); } else { sessionStorage.removeItem(TOKEN_KEY); }
    } catch (e) { /* storage refused: the token is asked again */ }
  }

  function absoluteTimes(root) {
    var times = root.querySelectorAll('time[data-ms]');
    for (var i = 0; i < times.length; i++) {
      var ms = Number(times[i].getAttribute('data-ms'));
      if (!isNaN(ms)) { times[i].title = new Date(ms).toISOString(); }
    }
  }

  function confirming() {
    return document.querySelector('#live .confirm:not([hidden])') !== null;
  }

  function schedule(ms) {
    if (timer !== null) { clearTimeout(timer); }
    timer = setTimeout(refresh, ms === undefined ? refreshMs : ms);
  }

  function refresh() {
    timer = null;
    if (busy || pressed || confirming()) { schedule(); return; }
    busy = true;
    fetch(location.href, { cache: 'no-store', credentials: 'same-origin' })
      .then(function (r) { return r.text(); })
      .then(function (text) {
        var doc = new DOMParser().parseFromString(text, 'text/html');
        var fresh = doc.getElementById('live');
        var live = document.getElementById('live');
        if (fresh && live && !pressed && !confirming()) {
          live.replaceWith(document.adoptNode(fresh));
          absoluteTimes(fresh);
        }
        document.getElementById('unreachable').hidden = true;
      })
      .catch(function () {
        document.getElementById('unreachable').hidden = false;
      })
      .then(function () {
        busy = false;
        generation += 1;
        body.setAttribute('data-generation', String(generation));
        schedule();
      });
  }

  function flash(ok, text) {
    var f = document.getElementById('flash');
    f.textContent = text;
    f.className = 'flash ' + (ok ? 'ok' : 'error');
    f.hidden = false;
  }

  function askToken(note) {
    var form = document.getElementById('token-form');
    form.querySelector('.token-note').textContent = note || '';
    form.hidden = false;
    form.querySelector('input').focus();
  }

  function send(form) {
    if (tokenRequired && !token()) {
      pending = form;
      askToken('This dashboard needs its token for actions.');
      return;
    }
    var headers = {};
    if (token()) { headers.Authorization = 'Bearer ' + token(); }
    busy = true;
    fetch(form.action, { method: 'POST', headers: headers, credentials: 'same-origin', cache: 'no-store' })
      .then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (doc) {
          var text = doc.message || (doc.error && doc.error.message) || (r.status + ' ' + r.statusText);
          flash(r.ok, text);
          if (r.status === 401) {
            setToken('');
            pending = form;
            askToken('The token was refused.');
          }
        });
      })
      .catch(function () { flash(false, 'The dashboard did not answer.'); })
      .then(function () { busy = false; schedule(0); });
  }

  function confirmBox(form) {
    return form.querySelector('.confirm');
  }

  function closeBox(box) {
    box.hidden = true;
    var ask = box.parentNode.querySelector('[data-step="ask"]');
    if (ask) { ask.hidden = false; }
  }

  document.addEventListener('submit', function (ev) {
    var form = ev.target;
    if (form.id === 'token-form') {
      ev.preventDefault();
      var input = form.querySelector('input');
      setToken(input.value.trim());
      input.value = '';
      form.hidden = true;
      if (pending) { var p = pending; pending = null; send(p); }
      return;
    }
    if (!form.hasAttribute('data-action')) { return; }
    ev.preventDefault();
    var step = ev.submitter ? ev.submitter.getAttribute('data-step') : null;
    var box = confirmBox(form);
    if (box && step === 'ask') {
      box.hidden = false;
      ev.submitter.hidden = true;
      return;
    }
    if (box) { closeBox(box); }
    send(form);
  });

  document.addEventListener('click', function (ev) {
    var t = ev.target;
    if (t instanceof Element && t.getAttribute('data-step') === 'cancel') {
      var box = t.closest('.confirm');
      if (box) { closeBox(box); }
    }
  });

  document.addEventListener('pointerdown', function () { pressed = true; });
  document.addEventListener('pointerup', function () { setTimeout(function () { pressed = false; }, 0); });
  document.addEventListener('pointercancel', function () { pressed = false; });

  absoluteTimes(document);
  schedule();
}());

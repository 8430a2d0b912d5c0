// redwheel dashboard: live refresh and actions. Served from the binary;
// no other script runs on these pages (Content-Security-Policy).
//
// Live refresh: every data-refresh-ms the page fetches itself again and
// swaps in the new <main id="live"> (the server renders and escapes it);
// it waits while a confirmation is open or an action runs. Each swap bumps
// body[data-generation], which tests watch.
// Actions: forms with data-action are sent with fetch() as POSTs with the
// token (Authorization: Bearer), asked for once and kept in the tab's
// session storage, and the X-Redwheel-Action header. A form that asks
// first opens its question on a submit (whatever button or key sent it);
// its "Yes" (a plain button) sends it with confirm=yes. Without this
// script the same form posts step=ask and the server answers a
// confirmation page: nothing is done on one click either way.
(function () {
  'use strict';
  var body = document.body;
  // 0: a page that is not refreshed (a confirmation, an action's outcome).
  var refreshAttr = Number(body.getAttribute('data-refresh-ms'));
  var refreshMs = isNaN(refreshAttr) ? 2000 : refreshAttr;
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
      // A time past a Date's range (+-8.64e15 ms) keeps its relative text.
      var d = new Date(Number(times[i].getAttribute('data-ms')));
      if (!isNaN(d.getTime())) { times[i].title = d.toISOString(); }
    }
  }

  function confirming() {
    return document.querySelector('#live .confirm:not([hidden])') !== null;
  }

  function schedule(ms) {
    if (refreshMs <= 0) { return; }
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

  function send(form, confirmed) {
    if (tokenRequired && !token()) {
      pending = { form: form, confirmed: confirmed };
      askToken('This dashboard needs its token for actions.');
      return;
    }
    var headers = {
      'Accept': 'application/json',
      'Content-Type': 'application/x-www-form-urlencoded',
      'X-Redwheel-Action': '1'
    };
    if (token()) { headers.Authorization = 'Bearer ' + token(); }
    var fields = new URLSearchParams();
    var inputs = form.querySelectorAll('input[type=hidden]');
    for (var i = 0; i < inputs.length; i++) {
      if (inputs[i].name !== 'step') { fields.append(inputs[i].name, inputs[i].value); }
    }
    if (confirmed) { fields.append('confirm', 'yes'); }
    busy = true;
    fetch(form.action, { method: 'POST', headers: headers, body: fields.toString(), credentials: 'same-origin', cache: 'no-store' })
      .then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (doc) {
          var text = doc.message || (doc.error && doc.error.message) || (r.status + ' ' + r.statusText);
          flash(r.ok, text);
          if (r.status === 401) {
            setToken('');
            pending = { form: form, confirmed: confirmed };
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
      if (pending) { var p = pending; pending = null; send(p.form, p.confirmed); }
      return;
    }
    if (!form.hasAttribute('data-action')) { return; }
    ev.preventDefault();
    var box = confirmBox(form);
    if (box) {
      // The first step, however it was sent: ask, do nothing.
      box.hidden = false;
      var ask = form.querySelector('[data-step="ask"]');
      if (ask) { ask.hidden = true; }
      return;
    }
    send(form, false);
  });

  document.addEventListener('click', function (ev) {
    var t = ev.target;
    if (!(t instanceof Element)) { return; }
    var step = t.getAttribute('data-step');
    var box = t.closest('.confirm');
    if (!box || (step !== 'yes' && step !== 'cancel')) { return; }
    closeBox(box);
    if (step === 'yes') { send(box.closest('form'), true); }
  });

  document.addEventListener('pointerdown', function () { pressed = true; });
  document.addEventListener('pointerup', function () { setTimeout(function () { pressed = false; }, 0); });
  document.addEventListener('pointercancel', function () { pressed = false; });

  absoluteTimes(document);
  schedule();
}());

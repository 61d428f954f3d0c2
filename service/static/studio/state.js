// Who is signed in and what they can spend; everyone else listens for changes.
import { api, get, onSignedOut } from './api.js';

const HINT = 'studio.session';
const bus = new EventTarget();
export const state = { user: null, balance: null, models: [], ready: false };

export function on(name, fn) { bus.addEventListener(name, (event) => fn(event.detail)); }
export function emit(name, detail) { bus.dispatchEvent(new CustomEvent(name, { detail })); }

// The session cookie is HttpOnly: script never sees it. A hint in localStorage
// remembers that this browser signed in, so a visitor who never did is not
// asked /api/me (and gets no 401); a stale hint costs one 401, then is cleared.
function hinted() { try { return localStorage.getItem(HINT) === '1'; } catch { return true; } }
function hint(on) { try { on ? localStorage.setItem(HINT, '1') : localStorage.removeItem(HINT); } catch { /* ignore */ } }

export async function loadSession() {
  if (hinted()) {
    try {
      setUser(await get('/me'));
    } catch (error) {
      if (error.status !== 401) throw error;
      setUser(null);
    }
  } else {
    setUser(null);
  }
  state.ready = true;
}

export function setUser(user) {
  const was = state.user?.id;
  state.user = user;
  hint(Boolean(user));
  setBalance(user ? user.credits : null);
  if (was !== user?.id) emit('user', user);
}

export function setBalance(balance) {
  if (state.balance === balance) return;
  state.balance = balance;
  emit('balance', balance);
}

export async function signOut() {
  emit('signing-out');
  try { await api('POST', '/auth/logout'); } finally { setUser(null); }
}

export async function loadModels() {
  const body = await get('/models');
  state.models = body.models;
  state.demo = body.demo;
  emit('models', state.models);
}

export const modelById = (id) => state.models.find((m) => m.id === id);
export const modelName = (id) => modelById(id)?.name || id;

onSignedOut(() => { if (state.user) setUser(null); });

// The proof of work sign-in asks for under load (ALTCHA v2, PBKDF2), solved with Web Crypto.
//
// Not the ALTCHA widget: it needs a Trusted Types policy, inline styles and blob:
// workers that this page's CSP refuses, and the page only has to answer an API
// 429, not to decorate a form. The algorithm is the widget's own:
// derivedKey = PBKDF2(hash, password = nonce ‖ uint32be(counter), salt, cost, keyLength)
// for counter = 0, 1, 2, … until the key's hex starts with keyPrefix.
const PARALLEL = Math.min(8, Math.max(2, navigator.hardwareConcurrency || 4));
const LAST_COUNTER = 0xffffffff;
const HASHES = { 'PBKDF2/SHA-256': 'SHA-256', 'PBKDF2/SHA-384': 'SHA-384', 'PBKDF2/SHA-512': 'SHA-512' };

const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
const unhex = (text) => Uint8Array.from(text.match(/../g) || [], (pair) => parseInt(pair, 16));

async function derive(parameters, hash, salt, nonce, counter) {
  const password = new Uint8Array(nonce.length + 4);
  password.set(nonce);
  new DataView(password.buffer).setUint32(nonce.length, counter, false);
  const key = await crypto.subtle.importKey('raw', password, 'PBKDF2', false, ['deriveBits']);
  const bits = await crypto.subtle.deriveBits(
    { name: 'PBKDF2', hash, salt, iterations: parameters.cost },
    key,
    parameters.keyLength * 8,
  );
  return hex(new Uint8Array(bits));
}

/** Solve a challenge from a 429 CHALLENGE_REQUIRED; resolve to the `altcha` field's value. */
export async function solveChallenge(challenge, { timeoutMs = 90_000 } = {}) {
  const { parameters } = challenge;
  const hash = HASHES[parameters.algorithm];
  if (!hash || !globalThis.crypto?.subtle) throw new Error('unsupported challenge');
  const salt = unhex(parameters.salt);
  const nonce = unhex(parameters.nonce);
  const prefix = String(parameters.keyPrefix).toLowerCase();
  const started = performance.now();
  // Several derivations at once: Web Crypto runs them off the main thread.
  for (let first = 0; first <= LAST_COUNTER; first += PARALLEL) {
    const tries = [];
    for (let i = 0; i < PARALLEL; i += 1) tries.push(derive(parameters, hash, salt, nonce, first + i));
    const keys = await Promise.all(tries);
    const hit = keys.findIndex((key) => key.startsWith(prefix));
    if (hit >= 0) {
      const time = Math.round(performance.now() - started);
      const solution = { counter: first + hit, derivedKey: keys[hit], time };
      return btoa(JSON.stringify({ challenge, solution }));
    }
    if (performance.now() - started > timeoutMs) break;
  }
  throw new Error('challenge not solved in time');
}

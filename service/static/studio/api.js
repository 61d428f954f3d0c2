// The one way this page talks to the server: same-origin fetch of /api, JSON in and out.
import { t, formatNumber, formatDate } from './i18n.js';

export class ApiError extends Error {
  constructor(status, body) {
    super(body?.error || `HTTP_${status}`);
    this.status = status;
    this.code = body?.error || `HTTP_${status}`;
    this.body = body || {};
  }
}

const listeners = new Set();
/** Hear about 401 NO_SESSION on any request: the session ended elsewhere. */
export function onSignedOut(fn) { listeners.add(fn); }

export async function api(method, path, { json, form, headers = {} } = {}) {
  const init = { method, headers: { Accept: 'application/json', ...headers }, credentials: 'same-origin' };
  if (json !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(json);
  } else if (form) {
    init.body = form;
  }
  let response;
  try {
    response = await fetch(`/api${path}`, init);
  } catch {
    throw new ApiError(0, { error: 'NETWORK' });
  }
  if (response.status === 204) return null;
  let body = null;
  try { body = await response.json(); } catch { /* not JSON: described by its status */ }
  if (!response.ok) {
    const error = new ApiError(response.status, body);
    if (response.status === 401) for (const fn of listeners) fn();
    throw error;
  }
  return body;
}

export const get = (path) => api('GET', path);
export const post = (path, json, headers) => api('POST', path, { json, headers });

let owed = 0;
/** Remember how many credits are owed, so a 402 PAYMENT_HOLD can say how many. */
export function knowOwed(n) { owed = Number(n) || 0; }

/** Turn an error code (and its fields) into a sentence. */
export function describe(error) {
  const code = error?.code || 'NETWORK';
  if (code === 'PAYMENT_HOLD') {
    const n = Number(error.body?.credits_owed) || owed;
    return n ? t('owed', { n: formatNumber(n) }) : t('err_PAYMENT_HOLD');
  }
  if (code === 'RATE_LIMITED') {
    return t('err_RATE_LIMITED', { s: Math.max(1, Math.ceil(Number(error.body?.retry_after) || 1)) });
  }
  if (code === 'BAD_REQUEST' && error.body?.field) {
    const field = error.body.field;
    const known = { prompt: 'prompt', negative_prompt: 'negative_prompt', size: 'size', count: 'count', seed: 'seed', reference: 'reference', model: 'model' };
    return t('err_BAD_FIELD', { field: known[field] ? t(known[field]) : field });
  }
  if (code === 'CONTENT_BLOCKED' && error.body?.field === 'negative_prompt') {
    return t('err_CONTENT_BLOCKED_negative_prompt');
  }
  if (code === 'ACCOUNT_SUSPENDED' && error.body?.until) {
    return t('err_ACCOUNT_SUSPENDED_until', { date: formatDate(error.body.until) });
  }
  const key = `err_${code}`;
  const text = t(key);
  return text === key ? t('err_generic', { code }) : text;
}

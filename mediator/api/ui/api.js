// The panel's only way to the Mediator: HTTP requests to this server's API (design.md §19, panel.md).
// Paths are relative ("v1/…"), so the panel also works behind a proxy that mounts it under a
// prefix. Errors carry the API's {error: {code, message}} body so a screen can show the sentence
// meant for a person. A server started without --dev wants a bearer token on every route: the
// panel asks for one on the first 401 and keeps it in sessionStorage (this tab only).

const TOKEN_KEY = "mediator-token";

export const auth = {
  get token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  },
  set token(value) {
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
  },
};

function headers(extra = {}) {
  return auth.token ? { ...extra, Authorization: `Bearer ${auth.token}` } : extra;
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function request(method, path, body) {
  const init = { method, headers: headers({ Accept: "application/json" }) };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    throw new ApiError(0, "unreachable", "The server cannot be reached.");
  }
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const e = (data && data.error) || {};
    throw new ApiError(response.status, e.code || "http_error", e.message || `HTTP ${response.status}`);
  }
  return data;
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : "";
}

const id = (value) => encodeURIComponent(value);

// Opens a record file in a new tab when the panel holds a token: a plain link would be refused
// (401), so the file is fetched with the header and shown from a blob: URL instead.
export async function openWithToken(url) {
  const tab = window.open("", "_blank");
  const response = await fetch(url, { headers: headers() });
  const blob = new Blob([await response.text()], { type: "text/plain;charset=utf-8" });
  if (tab) tab.location.href = URL.createObjectURL(blob);
}

// GET /v1/nodes is paged (docs/design.md §19): follow `next` until the last page, so the panel
// shows every node; observed_at is the first page's.
async function allNodes() {
  const first = await request("GET", "v1/nodes?limit=1000");
  const nodes = [...first.nodes];
  for (let after = first.next; after; ) {
    const page = await request("GET", `v1/nodes?limit=1000&after=${id(after)}`);
    nodes.push(...page.nodes);
    after = page.next;
  }
  return { ...first, nodes, next: null };
}

export const api = {
  nodes: allNodes,
  runs: (state, limit) => request("GET", `v1/runs${query({ state, limit })}`),
  run: (runId) => request("GET", `v1/runs/${id(runId)}`),
  asks: () => request("GET", "v1/asks"),
  answer: (askId, answer, ok) => request("POST", `v1/asks/${id(askId)}/answer`, { answer, ok }),
  record: (runId) => request("GET", `v1/runs/${id(runId)}/record`),
  recordUrl: (runId, file) => {
    const base = `v1/runs/${id(runId)}/record`;
    return file ? `${base}/${file.split("/").map(id).join("/")}` : base;
  },
};

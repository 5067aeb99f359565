// The console's words in English and Chinese. A key missing in one
// language falls back to English, and a missing English one shows the key.

const WORDS = {
  en: {
    title: "Leasehold",
    role_tenant: "Tenant",
    role_admin: "Operator",
    role_auditor: "Auditor",
    not_here: "This page is not yours to see.",
    or: "or",
    oidc_sign_in: "Sign in with your organisation (operators)",
    oidc_sign_in_all: "Sign in with your organisation",
    oidc_refused: "The sign-in did not complete: {why}",
    sign_in: "Sign in",
    sign_out: "Sign out",
    api_key: "API key",
    api_key_hint: "The key `lh tenant create` printed, or an operator's token. It stays in this tab only.",
    bad_key: "That key is not accepted.",
    unreachable: "The platform does not answer; try again shortly.",
    gpus: "GPUs",
    leases: "Leases",
    fleet: "Fleet",
    language: "Language",
    model: "Model",
    memory_gb: "Memory (GB)",
    zone: "Zone",
    free: "Free",
    in_shares: "Free in shares",
    mig: "MIG",
    basic: "Basic CNY/h",
    performance: "Performance CNY/h",
    spot_now: "Spot now CNY/h",
    no_gpus: "No GPUs can be rented now.",
    as_of: "As of",
    lease: "Lease",
    state: "State",
    node: "Node",
    members: "Nodes of the lease",
    part_started: "started",
    part_waiting: "starting",
    created: "Created",
    no_leases: "No leases yet.",
    live: "Live",
    heartbeat: "Last heartbeat",
    held: "held",
    loading: "Loading…",
    new_lease: "New lease",
    gpu_count: "GPUs",
    tier: "Tier",
    image: "Image (optional)",
    command: "Command (optional)",
    hours: "Price it for (hours)",
    quote: "Quote",
    quoted: "About {amount} {currency} for {hours} h at {unit} per GB-hour (price book {version})",
    price_moves: "Spot: billed at the price of each moment.",
    rent: "Rent",
    stop: "Stop",
    logs: "Logs",
    no_logs: "Nothing written yet.",
    invoices: "Invoices",
    period: "Period",
    status: "Status",
    total: "Total",
    csv: "CSV",
    no_invoices: "No invoices yet.",
  },
  zh: {
    title: "Leasehold 算力租赁",
    sign_in: "登录",
    sign_out: "退出",
    role_tenant: "租户",
    role_admin: "运维",
    role_auditor: "审计",
    not_here: "您无权查看此页面。",
    or: "或",
    oidc_sign_in: "使用单位账号登录（运维人员）",
    oidc_sign_in_all: "使用单位账号登录",
    oidc_refused: "登录未完成：{why}",
    api_key: "API 密钥",
    api_key_hint: "`lh tenant create` 打印的密钥，或运维令牌。仅保存在本标签页中。",
    bad_key: "该密钥未被接受。",
    unreachable: "平台暂无响应，请稍后重试。",
    gpus: "GPU",
    leases: "租约",
    fleet: "集群",
    language: "语言",
    model: "型号",
    memory_gb: "显存 (GB)",
    zone: "可用区",
    free: "空闲",
    in_shares: "可分片算力",
    mig: "MIG",
    basic: "基础 元/小时",
    performance: "性能 元/小时",
    spot_now: "竞价 元/小时",
    no_gpus: "当前没有可租用的 GPU。",
    as_of: "更新于",
    lease: "租约",
    state: "状态",
    node: "节点",
    members: "租约的节点",
    part_started: "已启动",
    part_waiting: "启动中",
    created: "创建时间",
    no_leases: "还没有租约。",
    live: "实时",
    heartbeat: "最近心跳",
    held: "已占用",
    loading: "加载中…",
    new_lease: "新建租约",
    gpu_count: "GPU 数量",
    tier: "计费档",
    image: "镜像（可选）",
    command: "命令（可选）",
    hours: "按小时报价",
    quote: "报价",
    quoted: "约 {amount} {currency}，{hours} 小时，每 GB·小时 {unit}（价目表 {version}）",
    price_moves: "竞价：按每一时刻的价格计费。",
    rent: "租用",
    stop: "停止",
    logs: "日志",
    no_logs: "尚无输出。",
    invoices: "账单",
    period: "账期",
    status: "状态",
    total: "合计",
    csv: "CSV",
    no_invoices: "还没有账单。",
  },
};

const STORED = "leasehold.language";

/// Adds a page's own words: `{ en: {...}, zh: {...} }`, so that each page
/// module keeps its words beside it.
export function addWords(words) {
  for (const [lang, entries] of Object.entries(words)) {
    WORDS[lang] = { ...(WORDS[lang] || {}), ...entries };
  }
}

/// The language: the one chosen before, else the browser's, else English.
export function language() {
  const chosen = localStorage.getItem(STORED);
  if (chosen && WORDS[chosen]) return chosen;
  return (navigator.language || "en").toLowerCase().startsWith("zh") ? "zh" : "en";
}

export function choose(lang) {
  if (WORDS[lang]) localStorage.setItem(STORED, lang);
}

export function t(key, values = {}) {
  const lang = language();
  const text = (WORDS[lang] && WORDS[lang][key]) || WORDS.en[key] || key;
  return text.replace(/\{(\w+)\}/g, (_, name) => (name in values ? String(values[name]) : `{${name}}`));
}

export const LANGUAGES = [["en", "English"], ["zh", "中文"]];

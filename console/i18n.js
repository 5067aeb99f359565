// The console's words in English and Chinese. A key missing in one
// language falls back to English, and a missing English one shows the key.

const WORDS = {
  en: {
    title: "Leasehold",
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
    created: "Created",
    no_leases: "No leases yet.",
    live: "Live",
    heartbeat: "Last heartbeat",
    held: "held",
    loading: "Loading…",
  },
  zh: {
    title: "Leasehold 算力租赁",
    sign_in: "登录",
    sign_out: "退出",
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
    created: "创建时间",
    no_leases: "还没有租约。",
    live: "实时",
    heartbeat: "最近心跳",
    held: "已占用",
    loading: "加载中…",
  },
};

const STORED = "leasehold.language";

/// The language: the one chosen before, else the browser's, else English.
export function language() {
  const chosen = localStorage.getItem(STORED);
  if (chosen && WORDS[chosen]) return chosen;
  return (navigator.language || "en").toLowerCase().startsWith("zh") ? "zh" : "en";
}

export function choose(lang) {
  if (WORDS[lang]) localStorage.setItem(STORED, lang);
}

export function t(key) {
  const lang = language();
  return (WORDS[lang] && WORDS[lang][key]) || WORDS.en[key] || key;
}

export const LANGUAGES = [["en", "English"], ["zh", "中文"]];

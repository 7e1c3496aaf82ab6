// The graph rewrite behind vknorm's fused layers: ncnn's text .param in, the same graph with every
// matching add -> norm -> activation run as one vknorm layer out. Only layer lines change; weights keep
// their order, so the .bin stays as it is (the removed layers, BinaryOp, Split and the activations, have none).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <ncnn/net.h>

#include "vknorm/ncnn.h"

namespace vknorm {
namespace ncnn {
namespace {

struct Line {
  std::string type, name;
  std::vector<std::string> bottoms, tops, params;  // params verbatim ("0=768", "-23310=1,1.0e-01")
  int line_no = 0;
  double pos = 0;  // where it is emitted: its own index, or just after the fused layer it moved behind
  bool removed = false;
};

[[noreturn]] void bad(int line_no, const std::string& what) {
  throw std::invalid_argument("line " + std::to_string(line_no) + ": " + what);
}

int parse_int(const std::string& s, int line_no, const std::string& what) {
  try {
    size_t used = 0;
    const int v = std::stoi(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  bad(line_no, "expected " + what + ", got '" + s + "'");
}

std::vector<std::string> split_ws(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string t; in >> t;) out.push_back(t);
  return out;
}

std::vector<Line> parse(const std::string& text) {
  std::istringstream in(text);
  std::string raw;
  int line_no = 0;
  auto next_tokens = [&]() -> std::vector<std::string> {
    while (std::getline(in, raw)) {
      ++line_no;
      auto t = split_ws(raw);
      if (!t.empty()) return t;
    }
    return {};
  };
  auto magic = next_tokens();
  if (magic.size() != 1 || magic[0] != "7767517")
    bad(line_no ? line_no : 1, "expected ncnn's magic number 7767517 (a text .param)" +
                                   (magic.empty() ? std::string(", the file is empty") : ", got '" + magic[0] + "'"));
  auto counts = next_tokens();
  if (counts.empty()) bad(line_no + 1, "expected 'layer_count blob_count', the file ends after the magic number");
  if (counts.size() != 2) bad(line_no, "expected 'layer_count blob_count'");
  const int layer_count = parse_int(counts[0], line_no, "a layer count");
  parse_int(counts[1], line_no, "a blob count");
  std::vector<Line> lines;
  for (auto t = next_tokens(); !t.empty(); t = next_tokens()) {
    if (t.size() < 4) bad(line_no, "expected 'type name bottom_count top_count ...', got '" + raw + "'");
    Line l;
    l.line_no = line_no;
    l.type = t[0], l.name = t[1];
    const int nb = parse_int(t[2], line_no, "layer " + l.name + "'s bottom count");
    const int nt = parse_int(t[3], line_no, "layer " + l.name + "'s top count");
    if (nb < 0 || nt < 0 || t.size() < 4 + size_t(nb) + size_t(nt))
      bad(line_no, "layer " + l.name + " names fewer blobs than its counts " + t[2] + " and " + t[3]);
    l.bottoms.assign(t.begin() + 4, t.begin() + 4 + nb);
    l.tops.assign(t.begin() + 4 + nb, t.begin() + 4 + nb + nt);
    l.params.assign(t.begin() + 4 + nb + nt, t.end());
    for (const std::string& p : l.params)
      if (p.find('=') == std::string::npos || p.front() == '=')
        bad(line_no, "layer " + l.name + ": param '" + p + "' is not id=value");
    l.pos = double(lines.size());
    lines.push_back(std::move(l));
  }
  if (int(lines.size()) != layer_count)
    throw std::invalid_argument("the header says " + std::to_string(layer_count) + " layers, the file has " +
                                std::to_string(lines.size()));
  return lines;
}

// A param's value text by id (arrays: id -23300 - k), or "" when absent.
std::string param(const Line& l, int id) {
  const std::string key = std::to_string(id) + "=";
  for (const std::string& p : l.params)
    if (p.compare(0, key.size(), key) == 0) return p.substr(key.size());
  return "";
}
// A param (int or float) as the matcher needs it; false where the text is not such a number whole (ncnn still
// loads such a line, reading the value its own way: the layer is then left as it is, never guessed at).
template <class T>
bool exact_param(const Line& l, int id, T def, T& out) {
  const std::string v = param(l, id);
  if (v.empty()) return out = def, true;
  try {
    size_t used = 0;
    if constexpr (std::is_same_v<T, int>) out = std::stoi(v, &used);
    else out = std::stof(v, &used);
    return used == v.size();
  } catch (const std::exception&) {
    return false;
  }
}

bool is_norm(const std::string& type) {
  return type == "LayerNorm" || type == "RMSNorm" || type == "GroupNorm" || type == "InstanceNorm";
}
NormOp norm_op(const std::string& type) {
  return type == "LayerNorm" ? NormOp::LayerNorm : type == "RMSNorm" ? NormOp::RMSNorm
                                                 : type == "GroupNorm" ? NormOp::GroupNorm : NormOp::InstanceNorm;
}

// A two-input add of blobs (no scalar): what the fused kernel can read as x + residual.
bool is_plain_add(const Line& l) {
  int op = -1, with_scalar = -1;
  return l.type == "BinaryOp" && l.bottoms.size() == 2 && l.tops.size() == 1 && exact_param(l, 0, 0, op) &&
         op == 0 && exact_param(l, 1, 0, with_scalar) && with_scalar == 0;
}

// ncnn's shape hints (-23330=n,v1,...,vn: n / top_count values per top, written by ncnnoptimize and pnnx). A line
// whose tops change must keep one run per top, or ncnn refuses the whole model ("invalid shape hints").
const std::string kShapeHints = std::to_string(-23330) + "=";
std::vector<std::string> shape_hints(const Line& l) {  // the values, or none when absent or malformed
  for (const std::string& p : l.params)
    if (p.compare(0, kShapeHints.size(), kShapeHints) == 0) {
      std::vector<std::string> v;
      std::istringstream in(p.substr(kShapeHints.size()));
      for (std::string t; std::getline(in, t, ',');) v.push_back(t);
      if (v.empty() || v[0] != std::to_string(v.size() - 1) || l.tops.empty() || (v.size() - 1) % l.tops.size())
        return {};
      return std::vector<std::string>(v.begin() + 1, v.end());
    }
  return {};
}
void set_shape_hints(Line& l, const std::vector<std::string>& v) {  // none: the line carries no hints
  for (auto it = l.params.begin(); it != l.params.end(); ++it)
    if (it->compare(0, kShapeHints.size(), kShapeHints) == 0) {
      l.params.erase(it);
      break;
    }
  if (v.empty()) return;
  std::string p = kShapeHints + std::to_string(v.size());
  for (const std::string& x : v) p += "," + x;
  l.params.push_back(p);
}

bool activation_of(const Line& l, Activation& a, float& alpha) {
  if (l.bottoms.size() != 1 || l.tops.size() != 1) return false;
  alpha = 0.f;
  if (l.type == "ReLU") {
    if (!exact_param(l, 0, 0.f, alpha)) return false;
    a = alpha == 0.f ? Activation::ReLU : Activation::LeakyReLU;
  } else if (l.type == "Sigmoid") {
    a = Activation::Sigmoid;
  } else if (l.type == "Swish") {
    a = Activation::Swish;
  } else if (l.type == "GELU") {
    int fast = 0;
    if (!exact_param(l, 0, 0, fast)) return false;
    a = fast ? Activation::FastGELU : Activation::GELU;
  } else {
    return false;
  }
  return true;
}

void erase_one(std::vector<int>& v, int x) {
  for (auto it = v.begin(); it != v.end(); ++it)
    if (*it == x) {
      v.erase(it);
      return;
    }
}

}  // namespace

FuseResult fuse_param(const std::string& text) {
  std::vector<Line> L = parse(text);
  std::map<std::string, int> producer;
  std::map<std::string, std::vector<int>> consumers;
  for (int i = 0; i < int(L.size()); ++i) {
    for (const std::string& b : L[i].bottoms) {
      if (!producer.count(b))
        bad(L[i].line_no, "layer " + L[i].name + " (" + L[i].type + ") reads blob '" + b +
                              "', which no earlier layer produces");
      consumers[b].push_back(i);
    }
    for (const std::string& t : L[i].tops) {
      if (producer.count(t)) bad(L[i].line_no, "blob '" + t + "' is produced twice (again by layer " + L[i].name + ")");
      producer[t] = i;
    }
  }
  // featmask (param 31) picks per layer what runs where (bit 4: off Vulkan): an add or activation joins a norm
  // only with the same featmask, so none changes where it runs.
  auto same_featmask = [](const Line& a, const Line& b) {
    int fa = 0, fb = 0;
    return exact_param(a, 31, 0, fa) && exact_param(b, 31, 0, fb) && fa == fb;
  };
  std::map<int, std::vector<int>> after;  // lines emitted right after a fused layer (a Split it now feeds)
  FuseResult result;
  for (int n = 0; n < int(L.size()); ++n) {
    Line& N = L[n];
    if (N.removed || !is_norm(N.type) || N.bottoms.size() != 1 || N.tops.size() != 1) continue;
    // Epilogue: an activation that is the only reader of the norm's output.
    int act = -1;
    Activation a = Activation::None;
    float alpha = 0.f;
    if (const auto& c = consumers[N.tops[0]]; c.size() == 1 && activation_of(L[c[0]], a, alpha) &&
                                               same_featmask(L[c[0]], N))
      act = c[0];
    // Prologue: the add that feeds it, directly or through a Split read only after the norm.
    int add = -1, split = -1;
    const std::string b = N.bottoms[0];
    const int P = producer.at(b);
    if (is_plain_add(L[P]) && consumers[b].size() == 1 && same_featmask(L[P], N)) {
      add = P;
    } else if (L[P].type == "Split" && L[P].bottoms.size() == 1) {
      const std::string& s = L[P].bottoms[0];
      const int Q = producer.at(s);
      bool read_later = true;
      for (const std::string& t : L[P].tops)
        for (int c : consumers[t])
          if (t != b && L[c].pos <= N.pos) read_later = false;
      // b itself read by the norm alone: the fused layer writes no blob named b for another reader
      if (is_plain_add(L[Q]) && consumers[s].size() == 1 && consumers[b].size() == 1 && read_later &&
          same_featmask(L[Q], N))
        add = Q, split = P;
    }
    if (add < 0 && act < 0) continue;

    FusedPattern fp;
    Line F = N;
    F.type = fused_name(norm_op(N.type));
    // ncnn's norms ignore the ids the fused layer reads (activation, its params, residual): drop any on the
    // line, so the fused layer does what the stock one did plus the fusion, and nothing else.
    for (int id : {kParamActivation, kParamActivationParams, -23300 - kParamActivationParams, kParamResidual}) {
      const std::string key = std::to_string(id) + "=";
      F.params.erase(std::remove_if(F.params.begin(), F.params.end(),
                                    [&](const std::string& p) { return p.compare(0, key.size(), key) == 0; }),
                     F.params.end());
    }
    if (add >= 0) fp.pattern = "BinaryOp+", fp.layers.push_back(L[add].name);
    fp.pattern += N.type;
    fp.layers.push_back(N.name);
    int residual = Fusion::None;
    if (add >= 0) {
      const Line& Q = L[add];
      F.bottoms = Q.bottoms;
      for (const std::string& x : Q.bottoms) erase_one(consumers[x], add), consumers[x].push_back(n);
      L[add].removed = true;
      residual = Fusion::Add;
      if (split >= 0) {
        Line& S = L[split];
        const std::string s = S.bottoms[0];
        std::vector<std::string> hints = shape_hints(S);
        const size_t per_top = hints.size() / S.tops.size();
        for (size_t t = 0; t < S.tops.size(); ++t)
          if (S.tops[t] == b) {
            S.tops.erase(S.tops.begin() + long(t));
            if (per_top) hints.erase(hints.begin() + long(t * per_top), hints.begin() + long((t + 1) * per_top));
            break;
          }
        set_shape_hints(S, hints);
        S.removed = true;
        if (S.tops.size() == 1) {
          // A Split of one: the fused layer writes the sum under that top's name, which its readers read
          // and which may be an output of the model (read by no layer).
          residual = Fusion::AddWriteSum, F.tops.push_back(S.tops[0]);
          producer[S.tops[0]] = n;
        } else if (S.tops.size() > 1) {  // it reads the sum now written by the fused layer: emitted right after it
          residual = Fusion::AddWriteSum, F.tops.push_back(s);
          producer[s] = n;
          S.pos = N.pos + 0.5;
          after[n].push_back(split);
        }
      }
    }
    if (act >= 0) {
      fp.pattern += "+" + L[act].type;
      fp.layers.push_back(L[act].name);
      F.tops[0] = L[act].tops[0];
      producer[F.tops[0]] = n;
      L[act].removed = true;
      F.params.push_back(std::to_string(kParamActivation) + "=" + std::to_string(int(a)));
      if (a == Activation::LeakyReLU) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%d=1,%.9e", -23300 - kParamActivationParams, double(alpha));
        F.params.push_back(buf);
      }
    }
    if (residual != Fusion::None) F.params.push_back(std::to_string(kParamResidual) + "=" + std::to_string(residual));
    // Every top of the fused layer (its output, the sum) has the norm's shape: the norm's hint for each.
    const std::vector<std::string> hint = shape_hints(N);
    std::vector<std::string> hints;
    for (size_t t = 0; t < F.tops.size() && !hint.empty(); ++t) hints.insert(hints.end(), hint.begin(), hint.end());
    set_shape_hints(F, hints);
    L[n] = F;
    result.fused.push_back(std::move(fp));
  }

  // Emit: kept lines in order, each moved Split right after the fused layer it reads.
  std::vector<const Line*> out;
  for (int i = 0; i < int(L.size()); ++i) {
    if (!L[i].removed) out.push_back(&L[i]);
    if (auto it = after.find(i); it != after.end())
      for (int j : it->second) out.push_back(&L[j]);
  }
  std::map<std::string, bool> blobs;
  for (const Line* l : out) {
    for (const auto& x : l->bottoms) blobs[x] = true;
    for (const auto& x : l->tops) blobs[x] = true;
  }
  std::ostringstream os;
  os << "7767517\n" << out.size() << " " << blobs.size() << "\n";
  for (const Line* l : out) {
    // ncnn's column layout; names of any length (ncnn reads up to 255 characters)
    os << std::left << std::setw(24) << l->type << " " << std::setw(24) << l->name << " " << l->bottoms.size() << " "
       << l->tops.size();
    for (const auto& x : l->bottoms) os << " " << x;
    for (const auto& x : l->tops) os << " " << x;
    for (const auto& x : l->params) os << " " << x;
    os << "\n";
  }
  result.param = os.str();
  return result;
}

namespace {
int load_fused_text(::ncnn::Net& net, const std::string& text, const char* origin, std::vector<FusedPattern>* fused) {
  if (fused) fused->clear();
  FuseResult r;
  try {
    r = fuse_param(text);
  } catch (const std::exception& e) {
    NCNN_LOGE("vknorm: %s: %s", origin, e.what());
    return -1;
  }
  const int ret = net.load_param_mem(r.param.c_str());
  if (fused && ret == 0) *fused = std::move(r.fused);  // what the loaded net holds
  return ret;
}
}  // namespace

int load_param_fused(::ncnn::Net& net, const char* param_path, std::vector<FusedPattern>* fused) {
  std::ifstream f(param_path, std::ios::binary);
  std::stringstream text;
  // A directory opens as a stream whose first read fails: that is "cannot read", not an empty .param.
  if (!f || !(text << f.rdbuf()) || f.bad()) {
    if (fused) fused->clear();
    NCNN_LOGE("vknorm: cannot read %s", param_path);
    return -1;
  }
  return load_fused_text(net, text.str(), param_path, fused);
}

int load_param_mem_fused(::ncnn::Net& net, const char* param_text, std::vector<FusedPattern>* fused) {
  return load_fused_text(net, param_text ? param_text : "", "load_param_mem", fused);
}

}  // namespace ncnn
}  // namespace vknorm

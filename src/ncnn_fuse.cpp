// The graph rewrite behind vknorm's fused layers: ncnn's text .param in, the same graph with every
// matching add -> norm -> activation run as one vknorm layer out. Only layer lines change; weights keep
// their order, so the .bin stays as it is (the removed layers, BinaryOp, Split and the activations, have none).
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
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
int int_param(const Line& l, int id, int def) {
  const std::string v = param(l, id);
  return v.empty() ? def : parse_int(v, l.line_no, "an integer for " + l.name + "'s param " + std::to_string(id));
}
float float_param(const Line& l, int id, float def) {
  const std::string v = param(l, id);
  if (v.empty()) return def;
  try {
    size_t used = 0;
    const float f = std::stof(v, &used);
    if (used == v.size()) return f;
  } catch (const std::exception&) {
  }
  bad(l.line_no, "expected a number for " + l.name + "'s param " + std::to_string(id) + ", got '" + v + "'");
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
  return l.type == "BinaryOp" && l.bottoms.size() == 2 && l.tops.size() == 1 && int_param(l, 0, 0) == 0 &&
         int_param(l, 1, 0) == 0;
}

bool activation_of(const Line& l, Activation& a, float& alpha) {
  if (l.bottoms.size() != 1 || l.tops.size() != 1) return false;
  alpha = 0.f;
  if (l.type == "ReLU") {
    alpha = float_param(l, 0, 0.f);
    a = alpha == 0.f ? Activation::ReLU : Activation::LeakyReLU;
  } else if (l.type == "Sigmoid") {
    a = Activation::Sigmoid;
  } else if (l.type == "Swish") {
    a = Activation::Swish;
  } else if (l.type == "GELU") {
    a = int_param(l, 0, 0) ? Activation::FastGELU : Activation::GELU;
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
  std::map<int, std::vector<int>> after;  // lines emitted right after a fused layer (a Split it now feeds)
  FuseResult result;
  for (int n = 0; n < int(L.size()); ++n) {
    Line& N = L[n];
    if (N.removed || !is_norm(N.type) || N.bottoms.size() != 1 || N.tops.size() != 1) continue;
    // Epilogue: an activation that is the only reader of the norm's output.
    int act = -1;
    Activation a = Activation::None;
    float alpha = 0.f;
    if (const auto& c = consumers[N.tops[0]]; c.size() == 1 && activation_of(L[c[0]], a, alpha)) act = c[0];
    // Prologue: the add that feeds it, directly or through a Split read only after the norm.
    int add = -1, split = -1;
    const std::string b = N.bottoms[0];
    const int P = producer.at(b);
    if (is_plain_add(L[P]) && consumers[b].size() == 1) {
      add = P;
    } else if (L[P].type == "Split" && L[P].bottoms.size() == 1) {
      const std::string& s = L[P].bottoms[0];
      const int Q = producer.at(s);
      bool read_later = true;
      for (const std::string& t : L[P].tops)
        for (int c : consumers[t])
          if (t != b && L[c].pos <= N.pos) read_later = false;
      if (is_plain_add(L[Q]) && consumers[s].size() == 1 && read_later) add = Q, split = P;
    }
    if (add < 0 && act < 0) continue;

    FusedPattern fp;
    Line F = N;
    F.type = fused_name(norm_op(N.type));
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
        for (auto it = S.tops.begin(); it != S.tops.end(); ++it)
          if (*it == b) {
            S.tops.erase(it);
            break;
          }
        producer[s] = n;
        if (!S.tops.empty()) residual = Fusion::AddWriteSum, F.tops.push_back(s);
        if (S.tops.size() <= 1) {  // a Split of one: its readers read the sum itself
          for (const std::string& t : S.tops)
            for (int c : consumers[t])
              for (std::string& x : L[c].bottoms)
                if (x == t) x = s, consumers[s].push_back(c);
          erase_one(consumers[s], split);
          S.removed = true;
        } else {  // it reads the sum now written by the fused layer: emitted right after it
          S.removed = true;
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
    char head[160];
    std::snprintf(head, sizeof head, "%-24s %-24s %zu %zu", l->type.c_str(), l->name.c_str(), l->bottoms.size(),
                  l->tops.size());
    os << head;
    for (const auto& x : l->bottoms) os << " " << x;
    for (const auto& x : l->tops) os << " " << x;
    for (const auto& x : l->params) os << " " << x;
    os << "\n";
  }
  result.param = os.str();
  return result;
}

int load_param_fused(::ncnn::Net& net, const char* param_path, std::vector<FusedPattern>* fused) {
  std::ifstream f(param_path, std::ios::binary);
  if (!f) {
    NCNN_LOGE("vknorm: cannot read %s", param_path);
    return -1;
  }
  std::stringstream text;
  text << f.rdbuf();
  FuseResult r;
  try {
    r = fuse_param(text.str());
  } catch (const std::exception& e) {
    NCNN_LOGE("vknorm: %s: %s", param_path, e.what());
    return -1;
  }
  if (fused) *fused = r.fused;
  return net.load_param_mem(r.param.c_str());
}

}  // namespace ncnn
}  // namespace vknorm

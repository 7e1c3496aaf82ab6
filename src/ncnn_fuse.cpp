// The graph rewrite behind vknorm's fused layers: ncnn's text .param in, the same graph with every
// matching add -> norm -> activation run as one vknorm layer out. Only layer lines change; weights keep
// their order, so the .bin stays as it is (the removed layers, BinaryOp, Split and the activations, have none).
#include <algorithm>
#include <cctype>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <locale>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <ncnn/datareader.h>
#include <ncnn/net.h>
#include <ncnn/paramdict.h>

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

// A message's text as one line of UTF-8: control characters (C0, C1, U+2028/9, which end a line for some readers)
// and bytes that are not UTF-8 written as \xNN (ncnn's log would end the message at a NUL; a reader of the log
// decodes UTF-8).
std::string printable(const std::string& what) {
  static const char hex[] = "0123456789abcdef";
  auto byte = [&](size_t k) { return k < what.size() ? static_cast<unsigned char>(what[k]) : 0u; };
  std::string said;
  for (size_t i = 0; i < what.size();) {
    const unsigned c = byte(i);
    const size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    unsigned cp = n == 1 ? c : c & (0x7f >> n);
    bool ok = n == 1 ? c >= 0x20 && c < 0x7f : i + n <= what.size();  // (a lone continuation byte: not UTF-8)
    for (size_t k = 1; ok && k < n; ++k) ok = (byte(i + k) & 0xc0) == 0x80, cp = cp << 6 | (byte(i + k) & 0x3f);
    static const unsigned least[] = {0, 0, 0x80, 0x800, 0x10000};  // below these: an overlong form
    ok = ok && (n == 1 || (cp >= least[n] && cp <= 0x10ffff && (cp < 0xd800 || cp > 0xdfff) &&
                           (cp < 0x80 || cp > 0x9f) && cp != 0x2028 && cp != 0x2029));
    if (ok) {
      said.append(what, i, n), i += n;
    } else {
      said += std::string("\\x") + hex[c >> 4] + hex[c & 15], ++i;
    }
  }
  return said;
}

[[noreturn]] void bad(int line_no, const std::string& what) {
  throw std::invalid_argument("line " + std::to_string(line_no) + ": " + printable(what));
}

// A number as ncnn's load_param reads the magic number and the counts (scan_net_value): a sign, then digits
// (+5, -0, 007), at most 31 characters, within int.
bool net_value(const std::string& s, int& value) {
  if (s.size() > 31) return false;
  const size_t digits = s[0] == '+' || s[0] == '-' ? 1 : 0;
  if (s.size() == digits || s.find_first_not_of("0123456789", digits) != std::string::npos) return false;
  long long v = 0;
  for (size_t k = digits; k < s.size(); ++k)
    if ((v = v * 10 + (s[k] - '0')) > 2147483648LL) return false;
  if (s[0] == '-') v = -v;
  if (v > 2147483647LL) return false;
  value = int(v);
  return true;
}

int parse_int(const std::string& s, int line_no, const std::string& what) {
  int v = 0;
  if (!net_value(s, v)) bad(line_no, "expected " + what + ", got '" + s + "'");
  return v;
}

// Whitespace-separated tokens, as ncnn reads a line's params; a param value that starts with a double quote (a
// string param, 5="a b") runs to the closing quote, spaces and all, as ncnn's ParamDict reads it. A quote anywhere
// else is a character like any other. (Types, names and blob names are read apart: header_tokens.)
std::vector<std::string> split_ws(const std::string& s) {
  std::vector<std::string> out;
  std::string token;
  bool quoted = false;
  for (const char c : s) {
    if (c == '"' && (quoted || (!token.empty() && token.back() == '=' && token.find('=') == token.size() - 1)))
      quoted = !quoted;
    if (!quoted && std::isspace(static_cast<unsigned char>(c))) {
      if (!token.empty()) out.push_back(std::move(token)), token.clear();
      continue;
    }
    token += c;
  }
  if (!token.empty()) out.push_back(std::move(token));
  return out;
}

// The next whitespace-separated word of a line from position `at`, appended to `out` (false at the line's end);
// `at` moves past it. ncnn reads type, name, counts and blob names so (scanf's %s), a quote being a character
// like any other there, and uses each as a C string: it ends at a NUL.
bool line_word(const std::string& s, size_t& at, std::vector<std::string>& out) {
  auto space = [&](size_t k) { return std::isspace(static_cast<unsigned char>(s[k])) != 0; };
  while (at < s.size() && space(at)) ++at;
  if (at == s.size()) return false;
  const size_t start = at;
  while (at < s.size() && !space(at)) ++at;
  const std::string word = s.substr(start, at - start);
  out.push_back(word.substr(0, word.find('\0')));
  return true;
}

constexpr int kInput = -1;  // the producer of a blob the caller fills

// The blobs ncnn's load_param makes for these lines in this order, by blob index: for each line, a blob for each
// bottom no earlier line names (an input the caller fills through Extractor::input, as in a model without Input
// layers; `read_by` is that line), then one for each top (a name used again included).
struct BlobOf {
  std::string name;
  const Line* read_by = nullptr;
};
std::vector<BlobOf> blobs_of(const std::vector<const Line*>& lines) {
  std::set<std::string> named;
  std::vector<BlobOf> blobs;
  for (const Line* l : lines) {
    for (const std::string& b : l->bottoms)
      if (named.insert(b).second) blobs.push_back({b, l});
    named.insert(l->tops.begin(), l->tops.end());
    for (const std::string& t : l->tops) blobs.push_back({t});
  }
  return blobs;
}

std::vector<const Line*> pointers(const std::vector<Line>& lines) {
  std::vector<const Line*> p;
  for (const Line& l : lines) p.push_back(&l);
  return p;
}

std::vector<Line> parse(const std::string& text) {
  // ncnn ends a line at \r or \n alike (CRLF, and the old Mac's CR): so do the lines here.
  std::string lf;
  lf.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] != '\r') lf += text[i];
    else if (i + 1 >= text.size() || text[i + 1] != '\n') lf += '\n';
  std::istringstream in(lf);
  std::string raw;
  int line_no = 0;
  auto next_line = [&]() {  // the next line that is not blank, in raw
    while (std::getline(in, raw)) {
      ++line_no;
      if (raw.find_first_not_of(" \t\n\v\f") != std::string::npos) return true;
    }
    return false;
  };
  // ncnn reads a .param as words (scanf's %s: C's white space, line breaks included): the magic number, the two
  // counts, then each layer's type, name, counts and blob names; a layer's params are the rest of the line its last
  // word is on (ParamDict). So a header on one line, or a layer's words over several lines, load as in ncnn.
  size_t word_at = 0;  // where raw's next word starts
  int word_line = 0;   // the line of the word read last
  auto next_word = [&](std::vector<std::string>& out) {  // appended to out; false at the end of the text
    for (;; word_at = 0) {
      if (line_word(raw, word_at, out)) {
        if (out.back().empty())  // ncnn would take an empty name, which finds blobs not yet made
          bad(line_no, "a word starts with a NUL byte (an empty name to ncnn)");
        return word_line = line_no, true;
      }
      if (!next_line()) return false;
    }
  };
  auto rest_of_line = [&]() {  // ncnn reads it into a C string: it ends at a NUL
    std::string rest = raw.substr(word_at);
    word_at = raw.size();
    return rest.substr(0, rest.find('\0'));
  };
  auto trimmed = [](const std::string& s) {
    const size_t first = s.find_first_not_of(" \t\n\v\f");
    return first == std::string::npos ? std::string() : s.substr(first, s.find_last_not_of(" \t\n\v\f") + 1 - first);
  };
  std::vector<std::string> header;
  int magic = 0;
  if (!next_word(header) || !net_value(header[0], magic) || magic != 7767517) {
    const bool binary = !header.empty() && std::any_of(raw.begin(), raw.end(), [](char c) {  // the word's line
      return (static_cast<unsigned char>(c) < 0x20 && !std::isspace(static_cast<unsigned char>(c))) || c == 0x7f;
    });
    bad(header.empty() ? 1 : word_line, "expected ncnn's magic number 7767517 (a text .param)" +
                                            std::string(header.empty() ? ", the file is empty"
                                                        : binary  ? ", got binary data (the weights .bin?)"
                                                                  : ", got '" + header[0] + "'"));
  }
  if (!next_word(header)) bad(word_line + 1, "expected 'layer_count blob_count', the file ends after the magic number");
  const int layer_line = word_line;
  const int layer_count = parse_int(header[1], layer_line, "a layer count");
  if (!next_word(header)) bad(word_line, "expected 'layer_count blob_count'");
  const int header_line = word_line;  // the blob count's
  const int blob_count = parse_int(header[2], header_line, "a blob count");
  constexpr int kMaxNetCount = 1000000;  // ncnn's limit on both
  const bool layers_ok = layer_count > 0 && layer_count <= kMaxNetCount;
  if (!layers_ok || blob_count <= 0 || blob_count > kMaxNetCount)
    bad(layers_ok ? header_line : layer_line, "the header's layer and blob counts must be 1 to " +
                                                  std::to_string(kMaxNetCount) + " (ncnn refuses others), got " +
                                                  header[1] + " and " + header[2]);
  std::vector<Line> lines;
  std::vector<std::string> t;  // a layer's words: type, name, counts, blob names
  std::vector<int> at;         // the line of each
  // ncnn reads the header's count of layers and nothing after them
  while (int(lines.size()) < layer_count && next_word(t = {})) {
    Line l;
    l.line_no = word_line;
    at = {word_line};
    const std::string first_line = trimmed(raw);
    while (t.size() < 4 && next_word(t)) at.push_back(word_line);
    if (t.size() < 4) bad(l.line_no, "expected 'type name bottom_count top_count ...', got '" + first_line + "'");
    l.type = t[0], l.name = t[1];
    const int nb = parse_int(t[2], at[2], "layer " + l.name + "'s bottom count");
    const int nt = parse_int(t[3], at[3], "layer " + l.name + "'s top count");
    for (const int k : {2, 3})  // ncnn's limit
      if (const int n = k == 2 ? nb : nt; n > kMaxNetCount)
        bad(at[k], "layer " + l.name + "'s " + (k == 2 ? "bottom" : "top") + " count " + t[k] + ": ncnn takes at most " +
                       std::to_string(kMaxNetCount));
    while (nb >= 0 && nt >= 0 && t.size() < 4 + size_t(nb) + size_t(nt) && next_word(t)) at.push_back(word_line);
    if (nb < 0 || nt < 0 || t.size() < 4 + size_t(nb) + size_t(nt))
      bad(nb < 0 ? at[2] : nt < 0 ? at[3] : word_line,
          "layer " + l.name + " names fewer blobs than its counts " + t[2] + " and " + t[3]);
    for (size_t k = 0; k < t.size(); ++k)  // ncnn reads each with %255s and refuses a longer one
      if (k != 2 && k != 3 && t[k].size() > 255) {
        const std::string whose = k == 1 ? "a layer" : "layer '" + l.name.substr(0, 40) + (l.name.size() > 40 ? "'..." : "'");
        bad(at[k], whose + ": its " + (k == 0 ? "type" : k == 1 ? "name" : "blob name") + " '" + t[k].substr(0, 40) +
                       "'... is " + std::to_string(t[k].size()) + " characters; ncnn reads at most 255");
      }
    l.bottoms.assign(t.begin() + 4, t.begin() + 4 + nb);
    l.tops.assign(t.begin() + 4 + nb, t.begin() + 4 + nb + nt);
    l.params = split_ws(rest_of_line());
    for (const std::string& p : l.params)  // (on the line of the layer's last word)
      if (p.find('=') == std::string::npos || p.front() == '=')
        bad(word_line, "layer " + l.name + ": param '" + p + "' is not id=value");
    l.pos = double(lines.size());
    lines.push_back(std::move(l));
  }
  if (int(lines.size()) < layer_count)
    bad(layer_line, "the header says " + std::to_string(layer_count) + " layers, the file has " +
                        std::to_string(lines.size()));
  // ncnn gives every top a blob of its own (a name used again included), and a bottom no earlier layer produced
  // one too; it refuses a model with more blobs than the header declares (fewer are left unused).
  if (const std::vector<BlobOf> blobs = blobs_of(pointers(lines)); blobs.size() > size_t(std::max(blob_count, 0))) {
    // the likelier mistake where there is one: a misspelt bottom, not a miscounted header
    const auto input = std::find_if(blobs.begin(), blobs.end(), [](const BlobOf& b) { return b.read_by; });
    bad(header_line, "the header says " + std::to_string(blob_count) + " blobs, the layers make " +
                         std::to_string(blobs.size()) +
                         (input == blobs.end() ? ""
                                               : "; they count blob '" + input->name + "', which layer " +
                                                     input->read_by->name + " (line " +
                                                     std::to_string(input->read_by->line_no) +
                                                     ") reads and no earlier layer produces: an input of the model"));
  }
  return lines;
}

// The id ncnn reads from one param ("00=1" and "+0=1" are id 0; -23300-k=n,... is id k's array), or -1 where it
// reads none (ncnn refuses such a line).
int param_id(const std::string& p) {
  size_t n = 0;
  while (n < p.size() && n < 15 && (p[n] == '-' || p[n] == '+' || std::isdigit(static_cast<unsigned char>(p[n])))) ++n;
  if (n == p.size() || p[n] != '=') return -1;
  size_t i = (p[0] == '-' || p[0] == '+') ? 1 : 0;
  if (i == n) return -1;
  long long v = 0;
  for (; i < n; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(p[i]))) return -1;
    v = v * 10 + (p[i] - '0');
    if (v > (1ll << 32)) return -1;
  }
  if (p[0] == '-') v = -v;
  if (v <= -23300) v = -(v + 23300);
  return v >= 0 && v < NCNN_MAX_PARAM_COUNT ? int(v) : -1;
}

// ncnn's own ParamDict reads the line's params: ids as numbers, the last of an id given twice winning, values
// typed as ncnn types them. Null where ncnn would not load the line (the model then fails in ncnn, fused or not,
// and the line is left as it is) or where the rewrite's tokens may not be ncnn's items (a quoted string, which
// may hold spaces).
struct LineParams : ::ncnn::ParamDict {
  using ::ncnn::ParamDict::load_param;
};
std::unique_ptr<const ::ncnn::ParamDict> read_params(const Line& l) {
  std::string text;
  for (const std::string& p : l.params) {
    if (p.find('"') != std::string::npos || param_id(p) < 0) return nullptr;
    text += p + " ";
  }
  auto pd = std::make_unique<LineParams>();
  const unsigned char* mem = reinterpret_cast<const unsigned char*>(text.c_str());
  if (pd->load_param(::ncnn::DataReaderFromMemory(mem)) != 0) return nullptr;
  return pd;
}

// A scalar param as ncnn's layers read it (an int from an int, a float from either); false where ncnn reads it
// otherwise (a float given for an int, an array, a string: ncnn then takes the default or refuses the line) or
// does not read the line: the pattern is left as it is, never guessed at.
template <class T>
bool exact_param(const Line& l, int id, T def, T& out) {
  const auto pd = read_params(l);
  if (!pd) return false;
  const int type = pd->type(id);
  if (type == 0) return out = def, true;
  if constexpr (std::is_same_v<T, int>) {
    if (type != 2) return false;
  } else {
    if (type != 2 && type != 3) return false;
  }
  out = pd->get(id, def);
  return true;
}

// A stream that writes numbers as ncnn reads them whatever the process's locale: under a global C++ locale with a
// decimal comma or digit grouping (std::locale::global, as a Qt application may set) it wrote "1,0e-01" and
// "1.002"; snprintf wrote the comma under C's setlocale(LC_ALL, "") alone.
std::ostringstream c_locale_stream() {
  std::ostringstream s;
  s.imbue(std::locale::classic());
  return s;
}

// Removes every param ncnn would read as `id`, in any spelling.
void erase_param(Line& l, int id) {
  l.params.erase(std::remove_if(l.params.begin(), l.params.end(), [&](const std::string& p) { return param_id(p) == id; }),
                 l.params.end());
}

bool is_norm(const std::string& type) {
  return type == "LayerNorm" || type == "RMSNorm" || type == "GroupNorm" || type == "InstanceNorm";
}
NormOp norm_op(const std::string& type) {
  return type == "LayerNorm" ? NormOp::LayerNorm : type == "RMSNorm" ? NormOp::RMSNorm
                                                 : type == "GroupNorm" ? NormOp::GroupNorm : NormOp::InstanceNorm;
}

// ncnn's shape hints (id 30, written -23330=n,v1,...,vn by ncnnoptimize and pnnx): a run of 4 or 5 values per
// top. A line whose tops change must keep one run per top, or ncnn refuses the whole model ("invalid shape hints").
// False where ncnn refuses the line's hints (the pattern is then left as it is, for ncnn to say so); else `v` holds
// the values ncnn reads, none where there are none or ncnn ignores them.
bool shape_hints(const Line& l, std::vector<int>& v) {
  v.clear();
  const auto pd = read_params(l);
  if (!pd) return false;
  const int type = pd->type(30);
  if (type == 0) return true;
  if (type != 4 && type != 5) return false;
  const ::ncnn::Mat m = pd->get(30, ::ncnn::Mat());
  if (m.empty() || l.tops.empty()) return true;
  const size_t tops = l.tops.size(), n = size_t(m.w);
  if (n % tops || (n / tops != 4 && n / tops != 5)) return false;
  const int* p = m;
  const size_t step = n / tops;
  for (size_t t = 0; t < tops; ++t) {  // each run as ncnn checks it: dims 0-4, extents >= 0, a size that fits
    const int* r = p + t * step;
    const int dims = r[0];
    if (dims < 0 || dims > 4 || (dims == 4 && step != 5)) return false;
    if (dims == 0) continue;
    const int w = r[1], h = dims >= 2 ? r[2] : 1, d = dims == 4 ? r[3] : 1, c = dims >= 3 ? r[step - 1] : 1;
    if (w < 0 || h < 0 || d < 0 || c < 0) return false;
    const size_t limit = (SIZE_MAX - 15) / 4;
    size_t size = size_t(w);
    if (size > limit || (h != 0 && size > limit / size_t(h))) return false;
    size *= size_t(h);
    if (d != 0 && size > limit / size_t(d)) return false;
    size *= size_t(d);
    size = (size * 4 + 15) / 16 * 16 / 4;
    if (c != 0 && size > (SIZE_MAX / 4) / size_t(c)) return false;
  }
  v.assign(p, p + n);
  return true;
}
// Whether ncnn loads the line's params (its shape hints included): a layer fused away must be one ncnn would have
// loaded, or the fused model would load where the stock one fails.
// `hints`: where given, the shape hints ncnn reads (shape_hints).
bool ncnn_reads(const Line& l, std::vector<int>* hints = nullptr) {
  std::vector<int> own;
  if (!shape_hints(l, hints ? *hints : own)) return false;
  const int featmask = read_params(l)->type(31);  // an int, or none (ncnn: "invalid feature mask")
  return featmask == 0 || featmask == 1 || featmask == 2;
}
void set_shape_hints(Line& l, const std::vector<int>& v) {  // none: the line carries no hints
  erase_param(l, 30);
  if (v.empty()) return;
  std::string p = std::to_string(-23330) + "=" + std::to_string(v.size());
  for (int x : v) p += "," + std::to_string(x);
  l.params.push_back(p);
}

// A two-input add of blobs (no scalar): what the fused kernel can read as x + residual.
bool is_plain_add(const Line& l) {
  int op = -1, with_scalar = -1;
  return l.type == "BinaryOp" && l.bottoms.size() == 2 && l.tops.size() == 1 && ncnn_reads(l) && exact_param(l, 0, 0, op) &&
         op == 0 && exact_param(l, 1, 0, with_scalar) && with_scalar == 0;
}

bool activation_of(const Line& l, Activation& a, float& alpha) {
  const bool activation = l.type == "ReLU" || l.type == "Sigmoid" || l.type == "Swish" || l.type == "GELU";
  if (!activation || l.bottoms.size() != 1 || l.tops.size() != 1 || !ncnn_reads(l)) return false;
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
  // ncnn resolves a bottom to the first blob of that name: a name given to a second top (ncnn loads such a
  // model) names a blob no layer can read. Layers writing such a name are left as they are.
  // A bottom no earlier layer produces is an input of its own: a later top of that name is a second blob of it.
  std::map<std::string, int> producer;
  std::set<std::string> named_twice;
  std::map<std::string, std::vector<int>> consumers;
  for (int i = 0; i < int(L.size()); ++i) {
    for (const std::string& b : L[i].bottoms) {
      consumers[b].push_back(i);
      producer.emplace(b, kInput);
    }
    for (const std::string& t : L[i].tops)
      if (!producer.emplace(t, i).second) named_twice.insert(t);
  }
  auto writes_unique_names = [&](const Line& l) {
    return std::none_of(l.tops.begin(), l.tops.end(), [&](const std::string& t) { return named_twice.count(t) > 0; });
  };
  // An add taken into the norm reads its bottoms at the norm's place. An input's blob is made where its name is
  // first read, so if that is the add's read and a top between add and norm takes the name, the norm would find
  // that top instead.
  auto reads_at_the_norm_as_at_the_add = [&](const Line& add, const Line& norm) {
    return std::none_of(add.bottoms.begin(), add.bottoms.end(), [&](const std::string& b) {
      return producer.at(b) == kInput && named_twice.count(b) &&
             std::any_of(L.begin(), L.end(), [&](const Line& l) {
               return l.pos > add.pos && l.pos < norm.pos && std::count(l.tops.begin(), l.tops.end(), b);
             });
    });
  };
  // featmask (param 31) picks per layer what runs where (bit 4: off Vulkan): an add or activation joins a norm
  // only with the same featmask, so none changes where it runs.
  auto same_featmask = [](const Line& a, const Line& b) {
    int fa = 0, fb = 0;
    return exact_param(a, 31, 0, fa) && exact_param(b, 31, 0, fb) && fa == fb;
  };
  std::map<int, std::vector<int>> after;  // lines emitted right after a fused layer (a Split it now feeds)
  FuseResult result;
  for (const BlobOf& b : blobs_of(pointers(L))) result.blobs.push_back(b.name);
  for (int n = 0; n < int(L.size()); ++n) {
    Line& N = L[n];
    std::vector<int> hint;  // the norm's shape hint, given to every top of the fused layer
    if (N.removed || !is_norm(N.type) || N.bottoms.size() != 1 || N.tops.size() != 1 || !shape_hints(N, hint) ||
        !writes_unique_names(N))
      continue;
    // Epilogue: an activation that is the only reader of the norm's output.
    int act = -1;
    Activation a = Activation::None;
    float alpha = 0.f;
    if (const auto& c = consumers[N.tops[0]]; c.size() == 1 && activation_of(L[c[0]], a, alpha) &&
                                               same_featmask(L[c[0]], N) && writes_unique_names(L[c[0]]))
      act = c[0];
    // Prologue: the add that feeds it, directly or through a Split read only after the norm.
    int add = -1, split = -1;
    std::vector<int> split_hints;
    const std::string b = N.bottoms[0];
    const int P = producer.at(b);
    if (P == kInput) {  // read from the caller: nothing before the norm to fuse
    } else if (is_plain_add(L[P]) && consumers[b].size() == 1 && same_featmask(L[P], N) && writes_unique_names(L[P]) &&
               reads_at_the_norm_as_at_the_add(L[P], N)) {
      add = P;
    } else if (L[P].type == "Split" && L[P].bottoms.size() == 1 && writes_unique_names(L[P]) &&
               ncnn_reads(L[P], &split_hints)) {
      const std::string& s = L[P].bottoms[0];
      const int Q = producer.at(s);
      bool read_later = true;
      for (const std::string& t : L[P].tops)
        for (int c : consumers[t])
          if (t != b && L[c].pos <= N.pos) read_later = false;
      // b itself read by the norm alone: the fused layer writes no blob named b for another reader
      if (Q != kInput && is_plain_add(L[Q]) && consumers[s].size() == 1 && consumers[b].size() == 1 && read_later &&
          same_featmask(L[Q], N) && writes_unique_names(L[Q]) && reads_at_the_norm_as_at_the_add(L[Q], N))
        add = Q, split = P;
    }
    if (add < 0 && act < 0) continue;

    FusedPattern fp;
    Line F = N;
    F.type = fused_name(norm_op(N.type));
    // ncnn's norms ignore the ids the fused layer reads (activation, its params, residual): drop any on the
    // line, in whatever spelling ncnn reads as those ids, so the fused layer does what the stock one did plus the
    // fusion, and nothing else.
    for (int id : {kParamActivation, kParamActivationParams, kParamResidual}) erase_param(F, id);
    int residual = Fusion::None;
    bool split_gone = false;  // the Split between add and norm replaced too (not just one top fewer)
    if (add >= 0) {
      const Line& Q = L[add];
      F.bottoms = Q.bottoms;
      for (const std::string& x : Q.bottoms) erase_one(consumers[x], add), consumers[x].push_back(n);
      L[add].removed = true;
      residual = Fusion::Add;
      if (split >= 0) {
        Line& S = L[split];
        const std::string s = S.bottoms[0];
        const size_t per_top = split_hints.size() / S.tops.size();  // read where the Split was matched
        for (size_t t = 0; t < S.tops.size(); ++t)
          if (S.tops[t] == b) {
            S.tops.erase(S.tops.begin() + long(t));
            if (per_top)
              split_hints.erase(split_hints.begin() + long(t * per_top), split_hints.begin() + long((t + 1) * per_top));
            break;
          }
        set_shape_hints(S, split_hints);
        S.removed = true;
        split_gone = S.tops.size() <= 1;  // else emitted again, one top fewer
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
    // What it replaced, in the graph's order: the add (and the Split it fed the norm through, where that is gone),
    // the norm, the activation.
    if (add >= 0) fp.pattern = "BinaryOp+", fp.layers.push_back(L[add].name);
    if (split_gone) fp.pattern += "Split+", fp.layers.push_back(L[split].name);
    fp.pattern += N.type;
    fp.layers.push_back(N.name);
    if (act >= 0) {
      fp.pattern += "+" + L[act].type;
      fp.layers.push_back(L[act].name);
      F.tops[0] = L[act].tops[0];
      producer[F.tops[0]] = n;
      L[act].removed = true;
      F.params.push_back(std::to_string(kParamActivation) + "=" + std::to_string(int(a)));
      if (a == Activation::LeakyReLU) {  // a float array of one: ncnn reads it as a float by its '.' and 'e'
        std::ostringstream p = c_locale_stream();
        p << -23300 - kParamActivationParams << "=1," << std::scientific << std::setprecision(9) << double(alpha);
        F.params.push_back(p.str());
      }
    }
    if (residual != Fusion::None) F.params.push_back(std::to_string(kParamResidual) + "=" + std::to_string(residual));
    // Every top of the fused layer (its output, the sum) has the norm's shape: the norm's hint for each.
    std::vector<int> hints;
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
  std::ostringstream os = c_locale_stream();
  os << "7767517\n" << out.size() << " " << blobs_of(out).size() << "\n";
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
int load_fused_text(::ncnn::Net& net, const std::string& text, const char* origin, std::vector<FusedPattern>* fused,
                    std::vector<std::string>* blobs) {
  if (fused) fused->clear();
  if (blobs) blobs->clear();
  FuseResult r;
  try {
    r = fuse_param(text);
  } catch (const std::exception& e) {
    NCNN_LOGE("vknorm: %s: %s", origin, e.what());
    return -1;
  }
  const int ret = net.load_param_mem(r.param.c_str());
  if (fused && ret == 0) *fused = std::move(r.fused);  // what the loaded net holds
  if (blobs && ret == 0) *blobs = std::move(r.blobs);
  return ret;
}
}  // namespace

namespace {
// A .param's text, read in blocks up to its first word and on only where that word is ncnn's magic number: the
// weights given as the .param are refused from their first bytes (text then holds those), not read whole. False
// where the file cannot be read.
bool read_param_file(const char* param_path, std::string& text) {
  std::ifstream f(param_path, std::ios::binary);
  bool unreadable = !f.is_open(), magic_first = true;
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!unreadable) {
    char block[64];
    f.read(block, sizeof block);
    text.append(block, size_t(f.gcount()));
    if (f.bad()) {  // a directory (libstdc++: badbit at its first read), or a read error
      unreadable = true;
    } else {
      // the first word, once it ends here or is longer than ncnn reads a number (31 characters)
      const auto first = std::find_if_not(text.begin(), text.end(), space);
      const auto end = std::find_if(first, text.end(), space);
      if (first != text.end() && (end != text.end() || end - first > 31)) {
        const std::string word(first, end);
        int magic = 0;
        magic_first = net_value(word.substr(0, word.find('\0')), magic) && magic == 7767517;
        break;
      }
      if (!f) break;  // the end of the file: all of it is read
    }
  }
  if (!unreadable && f && magic_first) {
    try {
      text.append(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    } catch (const std::exception&) {  // a read error past the first bytes
      unreadable = true;
    }
  }
  return !unreadable;
}
}  // namespace

int load_param_fused(::ncnn::Net& net, const char* param_path, std::vector<FusedPattern>* fused,
                     std::vector<std::string>* blobs) {
  if (!param_path) {
    if (fused) fused->clear();
    if (blobs) blobs->clear();
    NCNN_LOGE("vknorm: load_param_fused: no path (null)");
    return -1;
  }
  std::string text;
  if (!read_param_file(param_path, text)) {
    if (fused) fused->clear();
    if (blobs) blobs->clear();
    NCNN_LOGE("vknorm: cannot read %s", param_path);
    return -1;
  }
  return load_fused_text(net, text, param_path, fused, blobs);
}

std::string first_fused_layer(const std::string& param_text) {
  try {
    for (const Line& l : parse(param_text))
      if (l.type.rfind("vknorm.", 0) == 0)
        return "line " + std::to_string(l.line_no) + ": layer " + printable(l.name) + " is " + printable(l.type);
  } catch (const std::invalid_argument&) {  // not a .param ncnn reads
  }
  return "";
}

bool fusion_folds(const std::string& type) {
  return type == "BinaryOp" || type == "Split" || type == "ReLU" || type == "Sigmoid" || type == "Swish" ||
         type == "GELU";
}

std::string first_fused_layer_in_file(const char* param_path) {
  std::string text;
  return param_path && read_param_file(param_path, text) ? first_fused_layer(text) : "";
}

int load_param_mem_fused(::ncnn::Net& net, const char* param_text, std::vector<FusedPattern>* fused,
                         std::vector<std::string>* blobs) {
  return load_fused_text(net, param_text ? param_text : "", "load_param_mem", fused, blobs);
}

}  // namespace ncnn
}  // namespace vknorm

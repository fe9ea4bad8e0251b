// A small SVG line-chart renderer (qvg/eval/chart.h): axes, 1/2/5 ticks, grid,
// labels, title, legend, vertical markers. Hand-written SVG 1.1, no dependencies.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <fmt/core.h>

#include "qvg/error.h"
#include "qvg/eval/chart.h"

namespace qvg {

std::vector<double> nice_ticks(double lo, double hi, int target) {
  std::vector<double> t;
  if (!std::isfinite(lo) || !std::isfinite(hi)) return t;
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) {
    t.push_back(lo);
    return t;
  }
  target = std::max(2, target);
  const double raw = (hi - lo) / double(target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = m * mag;
    if (raw <= step * 1.0000001) break;
  }
  const double first = std::ceil(lo / step - 1e-9) * step;
  for (int i = 0; i < 1000; ++i) {
    const double v = first + double(i) * step;
    if (v > hi + step * 1e-9) break;
    t.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  }
  return t;
}

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += ch;
    }
  }
  return o;
}

/// Tick label with as many decimals as the step needs; thousands grouped.
std::string tick_label(double v, double step) {
  // Enough decimals that every multiple of the step prints exactly (0.25 -> 2, 2.5 -> 1).
  int dec = 0;
  while (step > 0 && dec < 6) {
    const double scaled = step * std::pow(10.0, dec);
    if (std::abs(scaled - std::round(scaled)) <= 1e-6 * scaled) break;
    ++dec;
  }
  std::string s = fmt::format("{:.{}f}", v, dec);
  if (dec == 0 && std::abs(v) >= 10000) {
    std::string digits = s, sign;
    if (!digits.empty() && digits[0] == '-') sign = "-", digits = digits.substr(1);
    std::string g;
    for (size_t i = 0; i < digits.size(); ++i) {
      if (i > 0 && (digits.size() - i) % 3 == 0) g += ',';
      g += digits[i];
    }
    s = sign + g;
  }
  return s;
}

// Advance widths of DejaVu Sans (Book and Bold) for ASCII 32..126 in thousandths of
// an em, read from the fonts' hmtx tables (fonts-dejavu-core 2.37). The charts name
// DejaVu Sans first; Helvetica and Arial, the fallbacks, are narrower, so text laid
// out with these widths fits with either.
// clang-format off
constexpr short kDejaVu[2][95] = {
    {// Book
     318, 401, 460, 838, 636, 950, 780, 275, 390, 390, 500, 838, 318, 361, 318, 337, 636, 636, 636, 636,
     636, 636, 636, 636, 636, 636, 337, 337, 838, 838, 838, 531, 1000, 684, 686, 698, 770, 632, 575, 775,
     752, 295, 295, 656, 557, 863, 748, 787, 603, 787, 695, 635, 611, 732, 684, 989, 685, 611, 685, 390,
     337, 390, 838, 500, 500, 613, 635, 550, 635, 615, 352, 635, 634, 278, 278, 579, 278, 974, 634, 612,
     635, 635, 411, 521, 392, 634, 592, 818, 592, 592, 525, 636, 337, 636, 838},
    {// Bold
     348, 456, 521, 838, 696, 1002, 872, 306, 457, 457, 523, 838, 380, 415, 380, 365, 696, 696, 696, 696,
     696, 696, 696, 696, 696, 696, 400, 400, 838, 838, 838, 580, 1000, 774, 762, 734, 830, 683, 683, 821,
     837, 372, 372, 775, 637, 995, 837, 850, 733, 850, 770, 720, 682, 812, 774, 1103, 771, 724, 725, 457,
     365, 457, 838, 500, 500, 675, 716, 593, 716, 678, 435, 716, 712, 343, 343, 665, 343, 1042, 712, 687,
     716, 716, 493, 595, 478, 712, 652, 924, 645, 652, 582, 712, 365, 712, 838}};
// clang-format on

}  // namespace

double chart_text_width(const std::string& s, double px, bool bold) {
  double em = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 32 && c < 127) {
      em += kDejaVu[bold ? 1 : 0][c - 32] / 1000.0;
    } else if (c >= 0xC0) {  // the first byte of a UTF-8 sequence: a whole em (the widest
      em += c == 0xC2 && i + 1 < s.size() && s[i + 1] == '\xB7' ? 0.38 : 1.0;  // of ·, —, ×, ≥, →)
    }  // continuation bytes and controls add nothing
  }
  return em * px;
}

std::vector<std::string> wrap_chart_text(const std::string& text, double px, bool bold, double width,
                                         size_t max_lines) {
  std::vector<std::string> lines;
  std::string rest = text;
  // Break points, best first: after a "; " or " · " separator, else at a space.
  auto cut_at = [&](const std::string& t) -> std::pair<size_t, size_t> {  // (end of line, start of the next)
    size_t best_sep = std::string::npos, best_sp = std::string::npos;
    for (size_t i = 1; i < t.size(); ++i) {
      if (t[i] != ' ') continue;
      if (chart_text_width(t.substr(0, i), px, bold) > width) break;
      if (t[i - 1] == ';' || t.compare(i, 4, " \u00b7 ") == 0) best_sep = i;
      best_sp = i;
    }
    if (best_sep != std::string::npos && best_sep * 2 >= (best_sp == std::string::npos ? 0 : best_sp)) {
      const size_t next = t.compare(best_sep, 4, " \u00b7 ") == 0 ? best_sep + 4 : best_sep + 1;
      return {best_sep, next};
    }
    if (best_sp != std::string::npos) return {best_sp, best_sp + 1};
    // No space fits: cut inside the word (never splitting a UTF-8 sequence).
    size_t i = 1;
    while (i < t.size() && chart_text_width(t.substr(0, i + 1), px, bold) <= width) ++i;
    while (i > 1 && i < t.size() && (static_cast<unsigned char>(t[i]) & 0xC0) == 0x80) --i;
    return {i, i};
  };
  while (!rest.empty()) {
    while (!rest.empty() && rest.front() == ' ') rest.erase(0, 1);
    if (rest.empty()) break;
    if (chart_text_width(rest, px, bold) <= width) {
      lines.push_back(rest);
      break;
    }
    if (lines.size() + 1 >= max_lines) {  // the last line allowed: shortened with an ellipsis
      std::string t = rest;
      while (!t.empty() && chart_text_width(t + "\u2026", px, bold) > width) {
        unsigned char c;
        do {  // one whole UTF-8 character
          c = static_cast<unsigned char>(t.back());
          t.pop_back();
        } while ((c & 0xC0) == 0x80 && !t.empty());
      }
      lines.push_back(t + "\u2026");
      break;
    }
    const auto [end, next] = cut_at(rest);
    std::string line = rest.substr(0, end);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    lines.push_back(line);
    rest = rest.substr(std::min(rest.size(), next));
  }
  return lines;
}

namespace {

double text_width(const std::string& s, double px) {
  return chart_text_width(s, px, false);
}

}  // namespace

std::string render_line_chart(const LineChart& c) {
  if (c.width < 200 || c.height < 200)
    throw InvalidArgument(fmt::format("chart size must be at least 200 x 200 px, got {} x {}", c.width, c.height));
  for (const ChartSeries& s : c.series)
    if (s.x.size() != s.y.size())
      throw InvalidArgument(fmt::format("chart series '{}': x has {} values, y has {}; they must be equal", s.name,
                                        s.x.size(), s.y.size()));
  for (const ChartSeries& s : c.series)
    if (!s.point_titles.empty() && s.point_titles.size() != s.x.size())
      throw InvalidArgument(
          fmt::format("chart series '{}': {} point titles for {} points", s.name, s.point_titles.size(), s.x.size()));
  // The plotted y value: log10 on a log axis (non-finite where y <= 0: not drawn).
  auto plotted = [&](double y) {
    if (!c.log_y) return y;
    return y > 0 ? std::log10(y) : std::numeric_limits<double>::quiet_NaN();
  };

  // Data ranges (a staircase's last step extends one spacing to the right).
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const ChartSeries& s : c.series) {
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i])) continue;
      xmin = std::min(xmin, s.x[i]);
      xmax = std::max(xmax, s.x[i]);
      if (s.steps && i + 1 == s.x.size() && i > 0) xmax = std::max(xmax, 2 * s.x[i] - s.x[i - 1]);
      if (const double y = plotted(s.y[i]); std::isfinite(y)) {
        ymin = std::min(ymin, y);
        ymax = std::max(ymax, y);
      }
    }
  }
  for (const ChartMarker& m : c.markers) {
    xmin = std::min(xmin, m.x);
    xmax = std::max(xmax, m.x);
  }
  for (const ChartCallout& m : c.callouts) {
    xmin = std::min(xmin, m.x);
    xmax = std::max(xmax, m.x);
    if (const double y = plotted(m.y); std::isfinite(y)) ymin = std::min(ymin, y), ymax = std::max(ymax, y);
  }
  if (!std::isfinite(xmin)) xmin = 0, xmax = 1;
  if (!std::isfinite(ymin)) ymin = 0, ymax = 1;
  if (c.y_from_zero && !c.log_y) ymin = std::min(0.0, ymin);
  if (xmax == xmin) xmax = xmin + 1;
  std::vector<double> yt;
  double ystep = 1;
  if (c.log_y) {
    // Whole decades, a tick at each.
    ymin = std::floor(ymin);
    ymax = std::max(std::ceil(ymax), ymin + 1);
    for (double e = ymin; e <= ymax; ++e) yt.push_back(e);
  } else {
    if (ymax == ymin) ymax = ymin + (ymin == 0 ? 1 : std::abs(ymin) * 0.1);
    // Headroom above the data, then round the axis to the ticks.
    ymax += (ymax - ymin) * 0.06;
    yt = nice_ticks(ymin, ymax, 6);
    ystep = yt.size() > 1 ? yt[1] - yt[0] : 1;
    if (!yt.empty() && yt.back() < ymax) yt.push_back(yt.back() + ystep);
    if (!yt.empty() && yt.front() > ymin) yt.insert(yt.begin(), yt.front() - ystep);
    if (!yt.empty()) ymin = yt.front(), ymax = yt.back();
  }
  auto y_tick_label = [&](double v) { return c.log_y ? fmt::format("{:g}", std::pow(10.0, v)) : tick_label(v, ystep); };
  std::vector<double> xt = nice_ticks(xmin, xmax, 10);
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1;
  if (c.x_to_ticks && !xt.empty()) {
    if (xt.front() > xmin) xt.insert(xt.begin(), xt.front() - xstep);
    if (xt.back() < xmax) xt.push_back(xt.back() + xstep);
    xmin = xt.front(), xmax = xt.back();
  }

  // Layout.
  std::vector<const ChartSeries*> leg;
  for (const ChartSeries& s : c.series)
    if (s.legend && !s.name.empty()) leg.push_back(&s);
  // Text lines, wrapped to the width right of the plot's left edge (DejaVu Sans
  // metrics: chart_text_width): the title (bold 18 px, up to 2 lines), the subtitle
  // (12 px, up to 3), the note (bold 13 px, up to 3), legend entries (12 px, one line
  // each, shortened with an ellipsis when one alone is wider than a row).
  const double W = c.width, H = c.height;
  double ylab_w = 0;
  for (double v : yt) ylab_w = std::max(ylab_w, text_width(y_tick_label(v), 12));
  const double left = std::max(64.0, ylab_w + 40);
  const double right = 28;
  const double avail = W - left - right;
  const std::vector<std::string> title = wrap_chart_text(c.title, 18, true, avail, 2);
  const std::vector<std::string> sub = wrap_chart_text(c.subtitle, 12, false, avail, 3);
  const std::vector<std::string> note = wrap_chart_text(c.note, 13, true, avail, 3);
  // Legend rows: entries flow left to right under the note.
  const double leg_px = 12, swatch = 26, gap = 22;
  std::vector<std::vector<std::pair<const ChartSeries*, std::string>>> rows(1);
  double row_w = 0;
  for (const ChartSeries* s : leg) {
    const std::string name = wrap_chart_text(s->name, leg_px, false, avail - swatch - 6, 1).front();
    const double w = swatch + 6 + text_width(name, leg_px) + gap;
    if (row_w + w > avail && !rows.back().empty()) rows.emplace_back(), row_w = 0;
    rows.back().emplace_back(s, name);
    row_w += w;
  }
  if (leg.empty()) rows.clear();
  // Baselines: title lines 22 px apart from y = 28, then the subtitle and note lines
  // 18 px apart, then the legend rows 20 px apart.
  const double title_y = 28, sub_y = title_y + 22 * double(std::max<size_t>(title.size(), 1) - 1) + 20;
  const double note_y = sub_y + 18 * double(sub.size()) + 2;
  const double title_h = note_y - 10 + 18 * double(note.size());
  const double top = title_h + double(rows.size()) * 20 + 14;
  const double bottom = 58;
  const double px0 = left, px1 = W - right, py0 = top, py1 = H - bottom;
  auto X = [&](double x) { return px0 + (x - xmin) / (xmax - xmin) * (px1 - px0); };
  auto Y = [&](double y) { return py1 - (y - ymin) / (ymax - ymin) * (py1 - py0); };
  // A marker's fill and outline (see ChartSeries::marker_fill).
  auto marker_paint = [](const ChartSeries& s) {
    return s.marker_fill.empty() ? fmt::format("fill=\"{}\"", s.color)
                                 : fmt::format("fill=\"{}\" stroke=\"{}\"", s.marker_fill, s.color);
  };

  std::string o;
  o += fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
      c.width, c.height);
  o += fmt::format("<title>{}</title>\n", esc(c.title));
  o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", c.width, c.height);
  for (size_t i = 0; i < title.size(); ++i)
    o += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"18\" font-weight=\"bold\" fill=\"#222222\">{}</text>\n", px0,
        title_y + 22 * double(i), esc(title[i]));
  for (size_t i = 0; i < sub.size(); ++i)
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" fill=\"#555555\">{}</text>\n", px0,
                     sub_y + 18 * double(i), esc(sub[i]));
  for (size_t i = 0; i < note.size(); ++i)
    o += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"13\" font-weight=\"bold\" fill=\"#1f4e79\">{}</text>\n", px0,
        note_y + 18 * double(i), esc(note[i]));

  // Legend.
  for (size_t r = 0; r < rows.size(); ++r) {
    double lx = px0;
    const double ly = title_h + 12 + double(r) * 20;
    for (const auto& [s, name] : rows[r]) {
      if (s->line)
        o += fmt::format(
            "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
            "stroke-width=\"{:.1f}\"{}{}/>\n",
            lx, ly - 4, lx + swatch, ly - 4, s->color, std::max(2.0, s->width),
            s->dashed ? " stroke-dasharray=\"6,4\"" : "",
            s->opacity < 1 ? fmt::format(" stroke-opacity=\"{:.2f}\"", s->opacity) : "");
      if (s->markers)
        o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" {}/>\n", lx + swatch / 2, ly - 4,
                         marker_paint(*s));
      o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"{}\" fill=\"#333333\">{}</text>\n", lx + swatch + 6,
                       ly, leg_px, esc(name));
      lx += swatch + 6 + text_width(name, leg_px) + gap;
    }
  }

  // Plot area, grid and ticks.
  o += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#fbfbfb\" "
      "stroke=\"none\"/>\n",
      px0, py0, px1 - px0, py1 - py0);
  o += "<g class=\"grid\" stroke=\"#e3e3e3\" stroke-width=\"1\">\n";
  for (double v : yt)
    o += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>\n", px0, Y(v), px1, Y(v));
  for (double v : xt)
    if (v >= xmin && v <= xmax)
      o += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>\n", X(v), py0, X(v), py1);
  o += "</g>\n";
  o += "<g class=\"ticks\" font-size=\"12\" fill=\"#444444\">\n";
  for (double v : yt)
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", px0 - 8, Y(v) + 4,
                     y_tick_label(v));
  for (double v : xt)
    if (v >= xmin && v <= xmax)
      o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", X(v), py1 + 18,
                       tick_label(v, xstep));
  o += "</g>\n";
  o += fmt::format(
      "<g class=\"axes\" stroke=\"#333333\" stroke-width=\"1.2\">"
      "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\"/>"
      "<line x1=\"{0:.1f}\" y1=\"{2:.1f}\" x2=\"{3:.1f}\" y2=\"{2:.1f}\"/></g>\n",
      px0, py0, py1, px1);
  o += fmt::format(
      "<text id=\"x-label\" x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"13\" text-anchor=\"middle\" "
      "fill=\"#222222\">{}</text>\n",
      (px0 + px1) / 2, H - 16, esc(c.x_label));
  o += fmt::format(
      "<text id=\"y-label\" x=\"{0:.1f}\" y=\"{1:.1f}\" font-size=\"13\" text-anchor=\"middle\" fill=\"#222222\" "
      "transform=\"rotate(-90 {0:.1f} {1:.1f})\">{2}</text>\n",
      18.0, (py0 + py1) / 2, esc(c.y_label));

  // Markers.
  for (const ChartMarker& m : c.markers) {
    const double x = X(m.x);
    o += fmt::format(
        "<line class=\"marker\" x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" "
        "stroke=\"#888888\" stroke-width=\"1\" stroke-dasharray=\"3,3\"/>\n",
        x, py0, py1);
    const bool flip = x + text_width(m.label, 11) + 6 > px1;
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" fill=\"#666666\" text-anchor=\"{}\">{}</text>\n",
                     flip ? x - 4 : x + 4, py0 + 13, flip ? "end" : "start", esc(m.label));
  }

  // Series: clipped to the plot area.
  o += fmt::format(
      "<clipPath id=\"plot\"><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\"/></clipPath>\n",
      px0 - 4, py0 - 4, px1 - px0 + 8, py1 - py0 + 8);
  o += "<g clip-path=\"url(#plot)\">\n";
  for (const ChartSeries& s : c.series) {
    if (!s.id.empty()) o += fmt::format("<g id=\"{}\">\n", esc(s.id));
    std::string d;
    bool open = false;
    for (size_t i = 0; i < s.x.size() && s.line; ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(plotted(s.y[i]))) {
        open = false;
        continue;
      }
      const double x = X(s.x[i]), y = Y(plotted(s.y[i]));
      if (s.steps) {
        double xn;
        if (i + 1 < s.x.size() && std::isfinite(s.x[i + 1]))
          xn = X(s.x[i + 1]);
        else
          xn = i > 0 ? X(2 * s.x[i] - s.x[i - 1]) : x;
        d += open ? fmt::format(" V{:.1f} H{:.1f}", y, xn) : fmt::format(" M{:.1f},{:.1f} H{:.1f}", x, y, xn);
      } else {
        d += fmt::format(" {}{:.1f},{:.1f}", open ? 'L' : 'M', x, y);
      }
      open = true;
    }
    if (!d.empty())
      o += fmt::format(
          "<path class=\"series\" d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{:.1f}\" "
          "stroke-linejoin=\"round\" stroke-linecap=\"round\"{}{}><title>{}</title></path>\n",
          d.substr(1), s.color, s.width, s.dashed ? " stroke-dasharray=\"6,4\"" : "",
          s.opacity < 1 ? fmt::format(" stroke-opacity=\"{:.2f}\"", s.opacity) : "", esc(s.name));
    if (s.markers)
      for (size_t i = 0; i < s.x.size(); ++i) {
        const double y = plotted(s.y[i]);
        if (!std::isfinite(s.x[i]) || !std::isfinite(y)) continue;
        o += fmt::format("<circle{} cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{:g}\" {}{}",
                         s.point_class.empty() ? "" : fmt::format(" class=\"{}\"", esc(s.point_class)), X(s.x[i]), Y(y),
                         s.marker_radius, marker_paint(s),
                         s.opacity < 1 ? fmt::format(" fill-opacity=\"{:.2f}\"", s.opacity) : "");
        o += s.point_titles.empty() ? "/>\n" : fmt::format("><title>{}</title></circle>\n", esc(s.point_titles[i]));
      }
    if (!s.id.empty()) o += "</g>\n";
  }
  o += "</g>\n";

  // Callouts, over everything; the leader and text go left where the text would pass
  // the plot's right edge.
  for (const ChartCallout& m : c.callouts) {
    const double y = plotted(m.y);
    if (!std::isfinite(m.x) || !std::isfinite(y)) continue;
    const double cx = X(m.x), cy = Y(y);
    const bool flip = cx + 33 + text_width(m.text, 12) > px1;
    const double lead = flip ? -30 : 30, tx = flip ? cx - 33 : cx + 33;
    o += fmt::format("<g id=\"{}\">\n<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"7\" fill=\"{}\" stroke=\"#000000\"/>\n",
                     esc(m.id), cx, cy, m.fill);
    o += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#000000\"/>\n", cx, cy,
                     cx + lead, cy + m.dy);
    o += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" font-weight=\"bold\" fill=\"#222222\" "
        "text-anchor=\"{}\">{}</text>\n</g>\n",
        tx, cy + m.dy + 4, flip ? "end" : "start", esc(m.text));
  }
  o += "</svg>\n";
  return o;
}

}  // namespace qvg

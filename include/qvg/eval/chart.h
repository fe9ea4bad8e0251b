// qvg/eval/chart.h — the one SVG writer of the reports: line and scatter charts with
// "nice" ticks, legends, markers and call-outs (simulate's memory and attention
// charts, the frontier's scatter).
// Errors: every entry point validates its configuration first and throws
// InvalidArgument naming the field, its value and what is allowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace qvg {

// ---------------------------------------------------------------------------
// Charts (a small hand-written SVG renderer; no dependencies)

/// One line of a chart.
struct ChartSeries {
  std::string name;          ///< legend text (XML-escaped when rendered)
  std::vector<double> x, y;  ///< same length; non-finite y values break the line
  std::string color = "#1f77b4";
  double width = 2.0;  ///< stroke width in px
  bool dashed = false;
  bool steps = false;    ///< a staircase: y[i] holds from x[i] to x[i+1]
  bool markers = false;  ///< a dot at every point
  double opacity = 1.0;
  bool legend = true;          ///< listed in the legend
  bool line = true;            ///< the points joined (false, with `markers`: a scatter)
  double marker_radius = 2.6;  ///< px
  /// Empty: markers filled with `color`; else filled with this ("none": a ring) and
  /// outlined in `color`.
  std::string marker_fill;
  std::vector<std::string> point_titles;  ///< empty, or one tooltip per point (its marker's <title>)
  std::string id;                         ///< set: the series is drawn inside <g id="...">
  std::string point_class;                ///< set: the class attribute of every marker
};

/// A labelled point drawn over the series (e.g. "reference default"): a dot, a leader
/// line and bold text `dy` px below it (negative: above), in <g id="id">.
struct ChartCallout {
  std::string id, text;
  double x = 0, y = 0;
  std::string fill = "#f1c40f";
  double dy = 0;
};

/// A vertical marker line with a label (e.g. "window full").
struct ChartMarker {
  double x = 0;
  std::string label;
};

struct LineChart {
  std::string title, subtitle;  ///< the subtitle wraps onto a second line when too long
  std::string note;             ///< optional headline under the subtitle (e.g. the ratio)
  std::string x_label, y_label;
  std::vector<ChartSeries> series;
  std::vector<ChartMarker> markers;
  std::vector<ChartCallout> callouts;
  bool y_from_zero = true;  ///< the y axis starts at 0 (not with log_y)
  /// A log10 y axis over whole decades, a tick at each; y values <= 0 are not drawn.
  bool log_y = false;
  bool x_to_ticks = false;        ///< the x axis extends to the ticks either side of the data
  int width = 900, height = 460;  ///< px
};

/// Renders the chart as SVG text: axes with "nice" ticks (1, 2, 5 x 10^k), grid
/// lines, tick labels, axis labels (ids x-label and y-label), title, subtitle, a
/// legend, the series and the callouts.
/// Throws InvalidArgument when a series' x and y (or a non-empty point_titles) differ
/// in length or width/height < 200.
std::string render_line_chart(const LineChart& chart);

/// The width in px of `text` (UTF-8) at font size `px` in DejaVu Sans (bold or not),
/// the first font the charts name (Helvetica and Arial, the fallbacks, are narrower):
/// each ASCII character's advance from the font; any other character 1 em (the widest
/// of those the reports use), except the middle dot.
double chart_text_width(const std::string& text, double px, bool bold);

/// `text` cut into lines no wider than `width` (chart_text_width): at a "; " or " · "
/// separator where one fits in the line's second half, else at a space, else inside a
/// word. At most `max_lines` (>= 1) lines; the last one that would not fit is shortened
/// and ends with an ellipsis. Empty text: no line.
std::vector<std::string> wrap_chart_text(const std::string& text, double px, bool bold, double width, size_t max_lines);

/// Tick positions from lo to hi with a 1/2/5 x 10^k step, about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

}  // namespace qvg

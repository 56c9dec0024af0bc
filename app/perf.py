"""The GUI's fast paths, on by default; `bench-gui` switches them off to measure the previous
drawing and editing paths in the same run (`FAST = False`).

With FAST: the plots decimate to the plot's pixel width (two buckets per pixel column, peaks
kept), cache per tensor what does not change between selections (float64 copies, outlier
mask, sort order, envelopes), draw the channel envelope as one filled path, and set their
view ranges from the data they hold (no auto-range pass at paint time, which moved the axes
during a paint and painted each plot twice); llama.cpp's tensor names for the "never
re-typed" check are computed when the model opens, not on the first edit; the totals are
cached between changes; axes re-set their label's HTML only when its text changes; the scheme
table keeps each cell's value per role until the document changes; and an edit of a tensor of
4M+ weights first gets a sampled-rows error estimate (workbench.planning.estimate, shown "≈") before
the exact evaluation.
"""

FAST = True

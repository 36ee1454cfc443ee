echo data > f
: > f
wc -c < f

a=abc
[ -n "$a" ] && echo nonempty
[ -z "" ] && echo empty
[ "$a" = abc ] && echo equal
[ "$a" != abd ] && echo differ

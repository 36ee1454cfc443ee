test 3 -eq 3 && echo eq
test -z "" && echo z

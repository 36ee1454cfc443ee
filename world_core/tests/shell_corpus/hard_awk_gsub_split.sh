echo 'a-b-c' | awk '{n = split($0, p, "-"); gsub(/-/, "+"); print n, $0, p[3]}'

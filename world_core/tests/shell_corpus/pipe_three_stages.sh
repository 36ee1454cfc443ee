printf 'a b\nc d\ne f\n' | tr ' ' '\n' | wc -l

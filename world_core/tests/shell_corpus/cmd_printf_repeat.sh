printf '%s\n' one two three

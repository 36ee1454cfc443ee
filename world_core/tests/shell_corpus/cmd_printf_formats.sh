printf '%s-%s\n' a b
printf '%5d|%-5d|\n' 42 42
printf '%05.1f\n' 3.14159
printf '%x %o %X\n' 255 8 255

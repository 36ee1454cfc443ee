if true; then
	cat <<-EOF
	indented
		twice
	EOF
fi

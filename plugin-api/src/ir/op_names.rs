//! The families of elementwise and reducing operations, each variant with its mnemonic in `.tk`
//! text (docs/language.md §3).

macro_rules! op_names {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident => $text:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $var),* }
        impl $name {
            /// Every operation of this family.
            pub const ALL: &'static [$name] = &[$($name::$var),*];
            /// The mnemonic in `.tk` text.
            pub fn name(self) -> &'static str { match self { $($name::$var => $text),* } }
            /// Looks an operation up by mnemonic.
            pub fn from_name(s: &str) -> Option<$name> {
                match s { $($text => Some($name::$var),)* _ => None }
            }
        }
    };
}

op_names!(
    /// Elementwise unary operations.
    UnaryOp {
        /// `-x`.
        Neg => "neg",
        /// `|x|`.
        Abs => "abs",
        /// `e^x`.
        Exp => "exp",
        /// `2^x`.
        Exp2 => "exp2",
        /// natural log.
        Log => "log",
        /// base-2 log.
        Log2 => "log2",
        /// square root.
        Sqrt => "sqrt",
        /// `1/sqrt(x)`.
        Rsqrt => "rsqrt",
        /// sine.
        Sin => "sin",
        /// cosine.
        Cos => "cos",
        /// hyperbolic tangent.
        Tanh => "tanh",
        /// `1/(1+e^-x)`.
        Logistic => "logistic",
        /// `e^x - 1`, accurate near 0.
        Expm1 => "expm1",
        /// `ln(1 + x)`, accurate near 0.
        Log1p => "log1p",
        /// the error function.
        Erf => "erf",
        /// its inverse, on `[-1, 1]`.
        ErfInv => "erf_inv",
        /// arc sine, on `[-1, 1]`.
        Asin => "asin",
        /// arc cosine, on `[-1, 1]`.
        Acos => "acos",
        /// arc tangent.
        Atan => "atan",
        /// hyperbolic sine.
        Sinh => "sinh",
        /// hyperbolic cosine.
        Cosh => "cosh",
        /// round down.
        Floor => "floor",
        /// round up.
        Ceil => "ceil",
        /// round to the nearest integer, ties to even (`jnp.round`).
        Round => "round",
        /// logical or bitwise not.
        Not => "not",
    }
);

impl UnaryOp {
    /// Whether the op takes floats only.
    pub fn float_only(self) -> bool {
        !matches!(self, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not)
    }
}

op_names!(
    /// Elementwise binary operations.
    BinaryOp {
        /// `a + b`.
        Add => "add",
        /// `a - b`.
        Sub => "sub",
        /// `a * b`.
        Mul => "mul",
        /// `a / b`.
        Div => "div",
        /// truncated remainder.
        Rem => "rem",
        /// `a ^ b` (floats).
        Pow => "pow",
        /// the angle of the point `(b, a)`: C's `atan2(a, b)` (floats).
        Atan2 => "atan2",
        /// maximum.
        Max => "max",
        /// minimum.
        Min => "min",
        /// logical or bitwise and.
        And => "and",
        /// logical or bitwise or.
        Or => "or",
        /// logical or bitwise xor.
        Xor => "xor",
        /// shift left.
        Shl => "shl",
        /// shift right.
        Shr => "shr",
    }
);

op_names!(
    /// Elementwise comparisons; the result is `bool`.
    CmpOp {
        /// `==`.
        Eq => "eq",
        /// `!=`.
        Ne => "ne",
        /// `<`.
        Lt => "lt",
        /// `<=`.
        Le => "le",
        /// `>`.
        Gt => "gt",
        /// `>=`.
        Ge => "ge",
    }
);

op_names!(
    /// Reductions along one axis.
    ReduceOp {
        /// sum.
        Sum => "sum",
        /// product.
        Prod => "prod",
        /// maximum.
        Max => "max",
        /// minimum.
        Min => "min",
    }
);

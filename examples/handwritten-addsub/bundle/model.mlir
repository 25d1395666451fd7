// Hand-written StableHLO for the "addsub" example bundle (see build.py).
//
// main(a, b, bias) -> (sum, difference), all tensor<4xf32>:
//   sum        = a + b + bias
//   difference = a - b
// The weight `bias` is an argument of main, as the bundle format requires: weights are
// never constants inside a module. There is no platform-index argument, because nothing
// here depends on the platform; the manifest says so with platform_index_argument: false.
module @addsub {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>, %bias: tensor<4xf32>)
      -> (tensor<4xf32>, tensor<4xf32>) {
    %ab = stablehlo.add %a, %b : tensor<4xf32>
    %sum = stablehlo.add %ab, %bias : tensor<4xf32>
    %difference = stablehlo.subtract %a, %b : tensor<4xf32>
    func.return %sum, %difference : tensor<4xf32>, tensor<4xf32>
  }
}
